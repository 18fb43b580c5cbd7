"""A checkpoint's tokenizer as the server's `Tokenizer`: message ends from the rendered chat
template, pins' prefixes, stop ids with generation_config.json, and incremental text that
never splits a character."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.model.hf.synthetic import CHAT_TEMPLATE, EOS_ID, build_tokenizer
from engine.model.hf.tokenizer import HFTokenizer

SYSTEM = {"role": "system", "content": "You are a fox. Jump over the lazy dog."}
CHAT = [
    SYSTEM,
    {"role": "user", "content": "Hello, world!"},
    {"role": "assistant", "content": "I am fine, thank you."},
    {"role": "user", "content": "Say héllo in € and 😀"},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> HFTokenizer:
    return HFTokenizer.load(tokenizer_dir)


@pytest.fixture(scope="module")
def raw(tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    """transformers' own tokenizer of the same files: the reference."""
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def with_config(tokenizer_dir: Path, tmp_path: Path, **config) -> Path:
    """A copy of the tokenizer files with `tokenizer_config.json` fields replaced."""
    for path in tokenizer_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    config_path = tmp_path / "tokenizer_config.json"
    fields = json.loads(config_path.read_text()) | config
    config_path.write_text(json.dumps({k: v for k, v in fields.items() if v is not None}))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    if "chat_template" in config and config["chat_template"] is not None:
        (tmp_path / "chat_template.jinja").write_text(config["chat_template"])
    return tmp_path


def test_every_message_ends_after_its_end_token_and_the_prefix_renders_alone(tokenizer, raw):
    prompt = tokenizer.chat_prompt(CHAT)
    assert len(prompt.message_ends) == len(CHAT)
    for k, end in enumerate(prompt.message_ends, start=1):
        assert raw.decode(prompt.token_ids[:end]).endswith("<|end|>\n")
        assert prompt.token_ids[:end] == tokenizer.messages_prefix(CHAT[:k])
    # the open assistant header comes after the last message's end
    assert raw.decode(prompt.token_ids[prompt.message_ends[-1] :]) == "<|assistant|>\n"


def test_the_chat_is_the_templates_own_tokens(tokenizer, raw):
    expected = raw.apply_chat_template(
        CHAT, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert tokenizer.chat_prompt(CHAT).token_ids == list(expected)


def test_a_boundary_the_template_renders_otherwise_later_gets_no_offset(tokenizer_dir, tmp_path):
    # the last message is marked: a prefix of k messages renders message k unlike the chat
    marked = CHAT_TEMPLATE.replace(
        "|>\n{{ m['content'] }}", "|>{% if loop.last %}!{% endif %}\n{{ m['content'] }}"
    )
    assert marked != CHAT_TEMPLATE
    tokenizer = HFTokenizer.load(with_config(tokenizer_dir, tmp_path, chat_template=marked))
    prompt = tokenizer.chat_prompt(CHAT)
    assert prompt.message_ends == [len(tokenizer.messages_prefix(CHAT))]


def test_a_pinned_system_prompt_is_a_prefix_of_every_chat_that_starts_with_it(tokenizer):
    pinned = tokenizer.messages_prefix([SYSTEM])
    for question in ("first", "second question", "ünïcode"):
        chat = tokenizer.chat_prompt([SYSTEM, {"role": "user", "content": question}])
        assert chat.token_ids[: len(pinned)] == pinned
        assert chat.message_ends[0] == len(pinned)


def test_a_tokenizer_without_a_chat_template_refuses_chats_by_name(tokenizer_dir, tmp_path):
    tokenizer = HFTokenizer.load(with_config(tokenizer_dir, tmp_path, chat_template=None))
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.chat_prompt(CHAT)
    assert tokenizer.encode("Hello")  # completions still work


def test_stop_ids_join_the_tokenizers_eos_and_generation_configs(tokenizer_dir, tmp_path):
    assert HFTokenizer.load(tokenizer_dir).stop_token_ids == (EOS_ID,)
    path = with_config(tokenizer_dir, tmp_path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS_ID, 5, 7]}))
    assert HFTokenizer.load(path).stop_token_ids == (EOS_ID, 5, 7)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert HFTokenizer.load(path).stop_token_ids == (EOS_ID, 9)


def test_a_directory_without_a_tokenizer_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path} has no tokenizer"):
        HFTokenizer.load(tmp_path)


def test_the_missing_tokenizer_message_says_what_was_looked_for(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError) as info:
        HFTokenizer.load(tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert not message.rstrip().endswith(":"), message  # not "... from one of: "
    assert "looked for tokenizer.json, tokenizer_config.json" in message
    assert "found none of them" in message


def pushed(tokenizer: HFTokenizer, token_ids: list[int]) -> list[str]:
    detokenizer = tokenizer.detokenizer()
    return [*(detokenizer.push([t]) for t in token_ids), detokenizer.finish()]


def test_a_multibyte_character_is_held_back_until_it_is_whole(tokenizer):
    text = "héllo € 😀 ok"
    token_ids = tokenizer.encode(text)
    deltas = pushed(tokenizer, token_ids)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    # the tokenizer learned no merges for these: some characters span several tokens
    assert len(token_ids) > len(text.encode()) // 2 and "" in deltas[:-1]


@pytest.mark.parametrize("seed", range(10))
def test_random_ids_join_to_one_decode(tokenizer, raw, seed):
    rng = random.Random(seed)
    token_ids = [rng.randrange(tokenizer.vocab_size) for _ in range(200)]
    joined = "".join(pushed(tokenizer, token_ids))
    assert joined == raw.decode(token_ids, skip_special_tokens=True)


def test_prompt_ids_are_bounded_by_the_tokenizer_and_the_model(tokenizer_dir, raw) -> None:
    """A config whose embedding is smaller than the tokenizer bounds the ids a prompt may hold
    (an id past the embedding would fail inside the forward instead of at the request)."""
    config = tokenizer_dir / "config.json"
    config.write_text(json.dumps({"vocab_size": 100}))
    try:
        assert HFTokenizer.load(tokenizer_dir).vocab_size == 100
        config.write_text(json.dumps({"text_config": {"vocab_size": 10_000}}))
        assert HFTokenizer.load(tokenizer_dir).vocab_size == len(raw)
    finally:
        config.unlink()
