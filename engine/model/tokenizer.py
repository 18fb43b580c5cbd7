"""Byte-level tokenizer: ids 0-255 are bytes, then BOS and EOS; and a plain chat template."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


class ByteTokenizer:
    bos_id = BOS_ID
    eos_id = EOS_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, token_ids: Iterable[int]) -> str:
        """Bytes back to text; special ids are dropped and broken UTF-8 is replaced."""
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def decode_bytes(self, token_ids: Iterable[int]) -> bytes:
        return bytes(t for t in token_ids if 0 <= t < 256)


ASSISTANT_HEADER = "<|assistant|>\n"


def render_message(message: Mapping[str, str]) -> str:
    """One message as the plain chat template writes it: a `<|role|>` header, then its text."""
    return f"<|{message['role']}|>\n{message['content']}\n"


def render_messages(messages: Iterable[Mapping[str, str]]) -> str:
    """The messages alone, without the assistant's open header: a prefix of every chat that
    starts with them (what a pin of a system prompt renders)."""
    return "".join(render_message(m) for m in messages)


def render_chat(messages: Iterable[Mapping[str, str]]) -> str:
    """The plain chat template: one `<|role|>` header a message, then the assistant's header.

    A shared system message renders to the same leading bytes in every conversation, so its
    prefix is cached like any other.
    """
    return render_messages(messages) + ASSISTANT_HEADER


def message_ends(messages: Iterable[Mapping[str, str]]) -> list[int]:
    """The token offset where each rendered message ends (byte tokens: its UTF-8 length so far),
    not counting the assistant's open header: a chat request's message checkpoints."""
    ends, total = [], 0
    for message in messages:
        total += len(render_message(message).encode("utf-8"))
        ends.append(total)
    return ends
