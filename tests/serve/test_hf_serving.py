"""`junction serve --model DIR` end to end on a small random Bamba checkpoint built by
transformers: chats in the checkpoint's own template through the official `openai` client, a
pin of chat messages through the engine's command path, hits reported in `cached_tokens`, and
`/v1/models` telling the model and its cache geometry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.model.hf.tokenizer import HFTokenizer
from engine.pins import PinState
from engine.wire import Command
from publish.commands import CommandQueue
from tests.engine.model.hf_checkpoints import build_checkpoint
from tests.polling import wait_for
from tests.serve.conftest import MODEL, serve, text_prompt

UNIT = 16  # the match unit; Mamba blocks are 64 tokens
CACHE = CacheConfig(
    block_size=16, mamba_block_size=64, prefix_match_unit=UNIT, num_blocks=256, num_mamba_blocks=64
)


@pytest.fixture(scope="module", params=["BambaForCausalLM", "Qwen3_5ForCausalLM"])
def checkpoint(request, tmp_path_factory) -> Path:
    """A Mamba-2 hybrid and a Gated DeltaNet one."""
    return build_checkpoint(request.param, tmp_path_factory.mktemp("checkpoint"))


@pytest.fixture(scope="module")
def reference(checkpoint: Path):
    """transformers' tokenizer of the checkpoint: what the template renders."""
    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def hf_server(checkpoint: Path):
    model = ModelConfig(model_dir=str(checkpoint), device="cpu")
    yield from serve(Engine(CACHE, SchedulerConfig(), model, runner="torch"))


def rendered(reference, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return list(
        reference.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
    )


def system(seed: int) -> dict:
    return {"role": "system", "content": text_prompt(seed, 260)}


def test_a_chat_is_rendered_by_the_checkpoints_template(hf_server, reference):
    messages = [system(1), {"role": "user", "content": "Hello, world!"}]
    reply = hf_server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0
    )
    assert reply.usage.prompt_tokens == len(rendered(reference, messages, True))
    assert 1 <= reply.usage.completion_tokens <= 8


def test_a_second_chat_of_a_family_hits_its_whole_system_message(hf_server, reference):
    client = hf_server.client()
    family = system(2)

    def ask(question: str):
        messages = [family, {"role": "user", "content": question}]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)

    assert ask("first question").usage.prompt_tokens_details.cached_tokens == 0
    system_end = len(rendered(reference, [family], False))
    # the first chat kept the state where its system message ends (a message checkpoint)
    assert system_end % 64 and ask("second question").usage.prompt_tokens_details.cached_tokens == (
        system_end // UNIT * UNIT
    )


def test_a_pin_of_chat_messages_is_hit_by_the_first_chat(hf_server, checkpoint, reference):
    async_engine = hf_server.async_engine
    commands = CommandQueue(wake=async_engine.submit, tokenizer=HFTokenizer.load(checkpoint))
    async_engine.submit(commands.attach).result()
    pinned = system(3)
    payload = {"pin_id": "system", "messages": [pinned], "token_ids": [], "cache_salt": None}
    commands.on_command(Command(command="pin", payload=payload))

    def pin_state():
        return async_engine.submit(lambda e: e.pins.get("system")).result()

    wait_for("the pin", lambda: pin_state() and pin_state().state == PinState.MATERIALIZED, 30)
    boundary = len(rendered(reference, [pinned], False)) // UNIT * UNIT
    assert pin_state().boundary == boundary
    reply = hf_server.client().chat.completions.create(
        model=MODEL, messages=[pinned, {"role": "user", "content": "Hi"}], max_tokens=1
    )
    assert reply.usage.prompt_tokens_details.cached_tokens == boundary


def test_a_pin_of_text_is_tokenized_by_the_checkpoints_tokenizer(hf_server, checkpoint):
    async_engine = hf_server.async_engine
    tokenizer = HFTokenizer.load(checkpoint)
    commands = CommandQueue(wake=async_engine.submit, tokenizer=tokenizer)
    async_engine.submit(commands.attach).result()
    text = text_prompt(8, 300)
    # the control plane's byte tokens come too; the engine uses its own tokenizer instead
    payload = {"pin_id": "doc", "text": text, "token_ids": list(text.encode()), "cache_salt": None}
    commands.on_command(Command(command="pin", payload=payload))

    def pin_state():
        return async_engine.submit(lambda e: e.pins.get("doc")).result()

    wait_for("the pin", lambda: pin_state() and pin_state().state == PinState.MATERIALIZED, 30)
    assert len(tokenizer.encode(text)) < len(text.encode())  # not bytes
    assert pin_state().boundary == len(tokenizer.encode(text)) // UNIT * UNIT


def test_streamed_text_joins_to_the_whole_text(hf_server):
    client = hf_server.client()
    prompt = "Hello, world! héllo € " + text_prompt(4, 40)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_models_tell_the_architecture_and_the_cache_geometry(hf_server, checkpoint):
    (card,) = hf_server.client().models.list().data
    details = card.model_extra["junction"]
    config = json.loads((checkpoint / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if "layer_types" in config:  # Qwen
        num_attention = config["layer_types"].count("full_attention")
    else:
        num_attention = len(config["attn_layer_indices"])
    assert details["architecture"] == config["architectures"][0]
    assert card.model_extra["root"] == str(checkpoint)
    assert details["state_group"] == ("linear" if "layer_types" in config else "mamba")
    geometry = details["geometry"]
    assert (geometry["num_blocks"], geometry["num_mamba_blocks"]) == (256, 64)
    # a key and a value of [kv heads, head dim] floats per attention layer and token
    token_bytes = 2 * num_attention * config["num_key_value_heads"] * head_dim * 4
    assert geometry["attention_bytes_per_block"] == 16 * token_bytes
