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


def render_chat(messages: Iterable[Mapping[str, str]]) -> str:
    """The plain chat template: one `<|role|>` header a message, then the assistant's header.

    A shared system message renders to the same leading bytes in every conversation, so its
    prefix is cached like any other.
    """
    parts = [f"<|{m['role']}|>\n{m['content']}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"
