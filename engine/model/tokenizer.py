"""Byte-level tokenizer: ids 0-255 are bytes, then BOS and EOS; and a plain chat template.

`Tokenizer` is what the server asks of any tokenizer: this one, or a checkpoint's own
(`engine/model/hf/tokenizer.py`, whose `load_tokenizer` picks one for a model).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258

Message = Mapping[str, str]  # {"role": ..., "content": ...}


class ChatPrompt(NamedTuple):
    token_ids: list[int]  # the rendered chat, with the assistant's open header
    message_ends: list[int]  # token offsets where rendered messages end (the open header not)


class Detokenizer(Protocol):
    """Generated ids to text as they come; what may still change is held back."""

    def push(self, token_ids: Sequence[int]) -> str:
        """Take new ids; returns the text they settle."""
        ...

    def finish(self) -> str:
        """The output has ended: the held-back rest (broken characters replaced)."""
        ...


class Tokenizer(Protocol):
    """What the server needs of a tokenizer: text in, chat templates, stop ids, text out."""

    vocab_size: int
    stop_token_ids: tuple[int, ...]
    # the most UTF-8 bytes of text one token stands for: a text of `b` bytes is at least
    # `b / max_token_bytes` tokens, known before it is tokenized (`protocol.prompts`)
    max_token_bytes: int

    def encode(self, text: str) -> list[int]: ...

    def chat_prompt(self, messages: Sequence[Message]) -> ChatPrompt:
        """The chat as the template renders it for the assistant's answer."""
        ...

    def messages_prefix(self, messages: Sequence[Message]) -> list[int]:
        """The messages alone, up to the last one's end: a prefix of every chat that starts
        with them (what a pin of a system prompt holds)."""
        ...

    def detokenizer(self) -> Detokenizer: ...


class ByteDetokenizer:
    """Byte ids to text; an incomplete UTF-8 sequence waits for its last byte."""

    def __init__(self) -> None:
        # errors="replace" in an incremental decoder yields exactly what one decode of all
        # the bytes yields: it holds an incomplete tail and replaces only invalid bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Sequence[int]) -> str:
        return self._decoder.decode(bytes(t for t in token_ids if 0 <= t < 256))

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


class ByteTokenizer:
    bos_id = BOS_ID
    eos_id = EOS_ID
    vocab_size = VOCAB_SIZE
    stop_token_ids = (EOS_ID,)
    max_token_bytes = 1

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, token_ids: Iterable[int]) -> str:
        """Bytes back to text; special ids are dropped and broken UTF-8 is replaced."""
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def decode_bytes(self, token_ids: Iterable[int]) -> bytes:
        return bytes(t for t in token_ids if 0 <= t < 256)

    def chat_prompt(self, messages: Sequence[Message]) -> ChatPrompt:
        return ChatPrompt(self.encode(render_chat(messages)), message_ends(messages))

    def messages_prefix(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(render_messages(messages))

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer()


ASSISTANT_HEADER = "<|assistant|>\n"


def render_message(message: Message) -> str:
    """One message as the plain chat template writes it: a `<|role|>` header, then its text."""
    return f"<|{message['role']}|>\n{message['content']}\n"


def render_messages(messages: Iterable[Message]) -> str:
    """The messages alone, without the assistant's open header: a prefix of every chat that
    starts with them (what a pin of a system prompt renders)."""
    return "".join(render_message(m) for m in messages)


def render_chat(messages: Iterable[Message]) -> str:
    """The plain chat template: one `<|role|>` header a message, then the assistant's header.

    A shared system message renders to the same leading bytes in every conversation, so its
    prefix is cached like any other.
    """
    return render_messages(messages) + ASSISTANT_HEADER


def message_ends(messages: Iterable[Message]) -> list[int]:
    """The token offset where each rendered message ends (byte tokens: its UTF-8 length so far),
    not counting the assistant's open header: a chat request's message checkpoints."""
    ends, total = [], 0
    for message in messages:
        total += len(render_message(message).encode("utf-8"))
        ends.append(total)
    return ends
