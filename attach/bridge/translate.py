"""One peer event -> Junction's `Peer*` events (`engine.events`), through the `PeerTable`.

- `BlockStored` -> `PeerBlockStored`: hashes as hex (`peer_wire.hash_hex`), `medium` None as
  "GPU", `group` from vLLM's `kv_cache_spec_kind` (`group_name`), or, when the peer sends
  none (SGLang), "attention" for group 0 and `group{idx}` for the others;
- `BlockRemoved` -> `PeerBlockRemoved` of the hashes no block holds any more (`PeerTable`), in
  the group its stores named;
- `AllBlocksCleared` -> `PeerCacheCleared` of the rank.

What the store could not hold is refused here (`BadEvent`), not sent to be refused there: a
hash longer than `Hex` allows, a negative size or index, a medium or LoRA name with control
characters (a token id past 64 bits already fails the decode, `peer_wire.TokenId`).
"""

from __future__ import annotations

import re

from attach.bridge import peer_wire
from attach.bridge.table import PeerTable
from engine.events import (
    ATTENTION,
    INT32_MAX,
    MAMBA,
    MAX_PEER_TOKENS,
    CacheEvent,
    PeerBlockRemoved,
    PeerBlockStored,
    PeerCacheCleared,
)

#: vLLM's `KVCacheSpecKind` values with a short name of Junction's; others are sanitised.
KIND_GROUPS = {"full_attention": ATTENTION, "mamba": MAMBA, "sliding_window": "sliding_window"}
MAX_HEX = 128
_MEDIUM = re.compile(r"\A[^\x00-\x1f\x7f-\x9f\ud800-\udfff]{1,32}\Z")
_TEXT = re.compile(r"\A[^\x00\ud800-\udfff]{0,4096}\Z")
_NOT_NAME = re.compile(r"[^a-z0-9_]+")


class BadEvent(ValueError):
    """A peer event the store could not hold; the message says which field."""


def group_name(kind: str | None, group_idx: int) -> str:
    """A group's name from the peer's spec kind: Junction's short names, else the kind
    lowercased with every run of other characters as `_`, starting with a letter."""
    if kind is None:
        return ATTENTION if group_idx == 0 else f"group{group_idx}"
    name = KIND_GROUPS.get(kind)
    if name is not None:
        return name
    name = _NOT_NAME.sub("_", kind.lower()).strip("_")[:60]
    if not name:
        return f"group{group_idx}"
    return name if name[0].isalpha() else f"g_{name}"


def _hex(h: peer_wire.PeerHash) -> str:
    value = h.hex() if type(h) is bytes else peer_wire.hash_hex(h)
    if not value or len(value) > MAX_HEX:
        raise BadEvent(f"a block hash of {len(value) // 2} bytes (at most {MAX_HEX // 2})")
    return value


_MEDIUMS = {None: "GPU", "GPU": "GPU", "CPU": "CPU", "STORAGE": "STORAGE"}  # checked already


def _medium(medium: str | None) -> str:
    known = _MEDIUMS.get(medium)
    if known is not None:
        return known
    if not _MEDIUM.match(medium):
        raise BadEvent(f"medium {medium[:40]!r} is not a short name without control characters")
    if len(_MEDIUMS) < 64:
        _MEDIUMS[medium] = medium
    return medium


def _index(group_idx: int | None) -> int:
    idx = group_idx or 0
    if not 0 <= idx <= INT32_MAX:
        raise BadEvent(f"group_idx {idx} out of range")
    return idx


def translate(rank: int, event: object, table: PeerTable) -> list[CacheEvent]:
    """Junction's events for one peer event of `rank` (changes `table`); raises `BadEvent`."""
    kind = _KINDS.get(type(event))
    if kind == "stored":
        return [_stored(rank, event, table)]
    if kind == "removed":
        idx, medium = _index(getattr(event, "group_idx", None)), _medium(event.medium)
        gone = table.removed(rank, idx, medium, [_hex(h) for h in event.block_hashes])
        if not gone:
            return []
        group = table.group(rank, idx)
        return [
            PeerBlockRemoved(
                rank=rank, group_idx=idx, group=group, medium=medium, block_hashes=gone
            )
        ]
    if kind == "cleared":
        table.cleared(rank)
        return [PeerCacheCleared(rank=rank)]
    raise BadEvent(f"no translation for {type(event).__name__}")


_KINDS = {
    **dict.fromkeys(peer_wire.BlockStored, "stored"),
    **dict.fromkeys(peer_wire.BlockRemoved, "removed"),
    **dict.fromkeys(peer_wire.AllBlocksCleared, "cleared"),
}


def _stored(rank: int, event, table: PeerTable) -> PeerBlockStored:
    idx = _index(getattr(event, "group_idx", None))
    tokens = event.token_ids
    if len(tokens) > MAX_PEER_TOKENS:
        raise BadEvent(f"{len(tokens)} token ids in one BlockStored (at most {MAX_PEER_TOKENS})")
    if not 0 <= event.block_size <= INT32_MAX:
        raise BadEvent(f"block_size {event.block_size} out of range")
    lora = getattr(event, "lora_name", None)
    if lora is not None and not _TEXT.match(lora):
        raise BadEvent("lora_name holds NUL or is too long")
    parent = event.parent_block_hash
    stored = PeerBlockStored(
        rank=rank,
        group_idx=idx,
        group=group_name(getattr(event, "kv_cache_spec_kind", None), idx),
        medium=_medium(event.medium),
        block_hashes=[_hex(h) for h in event.block_hashes],
        parent_block_hash=None if parent is None else _hex(parent),
        block_size=event.block_size,
        token_ids=tokens,
        lora_name=lora,
    )
    table.stored(stored)
    return stored
