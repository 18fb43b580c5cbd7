"""A checkpoint's own tokenizer and chat template, through transformers, as a `Tokenizer`.

Message ends come from the rendered template. The chat is rendered and tokenized whole, and
for each message the messages up to it are rendered and tokenized alone (no generation
prompt). Where those are the chat's leading tokens, their count is the message's end. A
boundary where they are not (a template that renders a message differently once others
follow, a token merged across the boundary) gets no offset: a state kept there would not be
the one a sibling chat reaches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from jinja2 import TemplateError

from engine.model.tokenizer import ByteTokenizer, ChatPrompt, Message, Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"  # what a decode of an incomplete UTF-8 sequence ends with


class HFDetokenizer:
    """Ids to text by decoding a window, as vLLM does: the window starts a few ids before the
    unsent ones, so a tokenizer that treats a decode's first token apart (a dropped leading
    space) sees its context, and text ending in an incomplete character waits."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0  # the window's start: ids already sent, kept as context
        self._read_offset = 0  # ids before this are sent

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(
            self._ids[start:end], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def _take(self, is_final: bool) -> str:
        sent = self._decode(self._prefix_offset, self._read_offset)
        text = self._decode(self._prefix_offset, len(self._ids))
        if not is_final and (len(text) <= len(sent) or text.endswith(REPLACEMENT)):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(sent) :]

    def push(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        return self._take(is_final=False)

    def finish(self) -> str:
        return self._take(is_final=True)


def generation_eos_ids(model_dir: Path) -> list[int]:
    """`eos_token_id` of `generation_config.json` (one id or a list), if the file has one."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if eos is None:
        return []
    return [int(t) for t in eos] if isinstance(eos, list) else [int(eos)]


def config_vocab_size(model_dir: Path) -> int | None:
    """config.json's `vocab_size` (a multimodal config's `text_config`'s), if it has one."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


#: The files a checkpoint's tokenizer comes from: the fast one's serialization, its settings,
#: and what a slow one (SentencePiece, BPE) is built from.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def no_tokenizer_message(model_dir: Path, exc: Exception) -> str:
    """Why `model_dir`'s tokenizer did not load, on one line: the files looked for, those
    found, and transformers' reason whole (its message runs over several lines, and its first
    ends mid-sentence: "... from one of: ")."""
    found = [name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return (
        f"{model_dir} has no tokenizer transformers can load: looked for "
        f"{', '.join(TOKENIZER_FILES)}; found {', '.join(found) or 'none of them'} "
        f"({reason or type(exc).__name__})"
    )


class HFTokenizer:
    """`tokenizer` as the server's `Tokenizer`; generation stops at any of `stop_token_ids`."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: Sequence[int],
        model_vocab_size: int | None = None,
    ) -> None:
        """`model_vocab_size`: the rows of the model's embedding (config.json's vocab_size).
        A prompt's token ids must be ids of both the tokenizer and the model."""
        self._tokenizer = tokenizer
        self.vocab_size = min(len(tokenizer), model_vocab_size or len(tokenizer))
        self.stop_token_ids = tuple(dict.fromkeys(stop_token_ids))
        # a token's piece is at most as many characters as the bytes it stands for (byte-level
        # pieces are one character a byte), and a character is at most 4 bytes of UTF-8
        longest = max((len(piece) for piece in tokenizer.get_vocab()), default=1)
        self.max_token_bytes = 4 * max(longest, 1)

    @classmethod
    def load(cls, model_dir: str | Path) -> HFTokenizer:
        """The directory's tokenizer, offline; `ValueError` naming the directory if none."""
        from transformers import AutoTokenizer

        model_dir = Path(model_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(no_tokenizer_message(model_dir, exc)) from None
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        return cls(tokenizer, [*eos, *generation_eos_ids(model_dir)], config_vocab_size(model_dir))

    def encode(self, text: str) -> list[int]:
        """Text as the tokenizer encodes it alone, with its special tokens (a BOS, if any)."""
        return self._tokenizer.encode(text)

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        """The messages through the chat template, then tokenized as transformers does it
        (the template writes the special tokens itself)."""
        if not self._tokenizer.chat_template:
            raise ValueError("the model has no chat template (chat_template in tokenizer_config)")
        try:
            text = self._tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except TemplateError as exc:
            raise ValueError(f"the chat template refused the messages: {exc}") from None
        return self._tokenizer.encode(text, add_special_tokens=False)

    def chat_prompt(self, messages: Sequence[Message]) -> ChatPrompt:
        token_ids = self._render(messages, add_generation_prompt=True)
        ends = []
        for k in range(1, len(messages) + 1):
            try:
                prefix = self._render(messages[:k], add_generation_prompt=False)
            except ValueError:  # a template may refuse a chat that ends on this message
                continue
            if prefix and token_ids[: len(prefix)] == prefix:
                ends.append(len(prefix))
        return ChatPrompt(token_ids, ends)

    def messages_prefix(self, messages: Sequence[Message]) -> list[int]:
        return self._render(messages, add_generation_prompt=False)

    def detokenizer(self) -> HFDetokenizer:
        return HFDetokenizer(self._tokenizer)


def load_tokenizer(model_dir: str | None) -> Tokenizer:
    """A model's tokenizer: a checkpoint directory's own, or the built-in model's bytes."""
    return ByteTokenizer() if model_dir is None else HFTokenizer.load(model_dir)
