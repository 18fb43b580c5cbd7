"""The peer's KV-event wire, declared from what vLLM 0.33 and SGLang publish.

A batch is a msgpack array `[ts, events, data_parallel_rank]` (SGLang's has no rank). vLLM's
events are maps tagged `{"type": "BlockStored", ...}` with `omit_defaults` (absent fields take
the defaults below); SGLang's are arrays tagged by their first element
(`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
older releases without `medium`). Unknown fields (vLLM's `extra_keys`, `session_id`, ...) and
trailing array elements are ignored; a missing optional field is its default. Hashes are
bytes (sha256, vLLM's default) or ints (vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`,
SGLang).

`decode_batch` takes the fast path (one typed decode of the whole batch) and, when that
fails, decodes event by event so one event of an unknown tag or shape costs only itself.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import msgspec
from msgspec import Meta, Raw, Struct

PeerHash = bytes | int
# token ids past what the store's 64-bit columns hold fail the decode (in C, not per token)
TokenId = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


def hash_hex(h: PeerHash) -> str:
    """A peer block hash as lowercase hex: bytes as they are; an int as its shortest signed
    big-endian bytes (so 255 -> "00ff", -1 -> "ff")."""
    if isinstance(h, bytes):
        return h.hex()
    return h.to_bytes(max(1, (h.bit_length() + 8) // 8), "big", signed=True).hex()


# --- vLLM: map-tagged events ---------------------------------------------------------------
class _MapEvent(Struct, tag=True, gc=False):
    pass


class VllmBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[PeerHash]
    parent_block_hash: PeerHash | None = None
    token_ids: list[TokenId] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class VllmBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[PeerHash]
    medium: str | None = None
    group_idx: int | None = None


class VllmAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


# --- SGLang: array-tagged events -----------------------------------------------------------
class _ArrayEvent(Struct, tag=True, array_like=True, gc=False):
    pass


class SglangBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[PeerHash]
    parent_block_hash: PeerHash | None = None
    token_ids: list[TokenId] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None


class SglangBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[PeerHash]
    medium: str | None = None


class SglangAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared
SglangEvent = SglangBlockStored | SglangBlockRemoved | SglangAllBlocksCleared
BlockStored = (VllmBlockStored, SglangBlockStored)
BlockRemoved = (VllmBlockRemoved, SglangBlockRemoved)
AllBlocksCleared = (VllmAllBlocksCleared, SglangAllBlocksCleared)


class _VllmBatch(Struct, array_like=True, gc=False):
    ts: float
    events: list[VllmEvent]
    data_parallel_rank: int | None = None


class _SglangBatch(Struct, array_like=True, gc=False):
    ts: float
    events: list[SglangEvent]
    data_parallel_rank: int | None = None


class _RawBatch(Struct, array_like=True, gc=False):
    ts: float
    events: list[Raw]
    data_parallel_rank: int | None = None


class DecodedBatch(NamedTuple):
    ts: float
    events: list[Any]  # the events decoded, in order (the undecodable left out)
    data_parallel_rank: int | None
    bad_events: list[str]  # why each event left out failed ("unknown tag 'X'", ...)


class BadBatch(ValueError):
    """A payload that is not a batch at all (not msgpack, not `[ts, events, ...]`)."""


_FAST = {
    "vllm": msgspec.msgpack.Decoder(_VllmBatch),
    "sglang": msgspec.msgpack.Decoder(_SglangBatch),
}
_RAW = msgspec.msgpack.Decoder(_RawBatch)
_ONE = [msgspec.msgpack.Decoder(VllmEvent), msgspec.msgpack.Decoder(SglangEvent)]
_ANY = msgspec.msgpack.Decoder()


def decode_batch(payload: bytes, flavor: str = "vllm") -> DecodedBatch:
    """The peer's batch in `payload`; raises `BadBatch` when it is no batch. `flavor` picks
    the fast path; either flavor's events are understood on the slow one."""
    try:
        batch = _FAST[flavor].decode(payload)
        return DecodedBatch(batch.ts, batch.events, batch.data_parallel_rank, [])
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    try:
        raw = _RAW.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadBatch(f"not a KV event batch: {exc}") from None
    decoders = _ONE if flavor == "vllm" else _ONE[::-1]
    events, bad = [], []
    for item in raw.events:
        for decoder in decoders:
            try:
                events.append(decoder.decode(item))
                break
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
        else:
            bad.append(_why(item))
    return DecodedBatch(raw.ts, events, raw.data_parallel_rank, bad)


def _why(item: Raw) -> str:
    """What is wrong with an event neither flavor decodes, in a few words for the log."""
    try:
        value = _ANY.decode(item)
    except msgspec.DecodeError:
        return "undecodable event"
    if isinstance(value, dict):
        tag = value.get("type")
    elif isinstance(value, list) and value:
        tag = value[0]
    else:
        return f"not an event (a {type(value).__name__})"
    if tag in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        return f"malformed {tag}"
    return f"unknown event tag {str(tag)[:64]!r}"
