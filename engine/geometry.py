"""`CacheGeometry`: what an engine's hello says of its cache, declared once.

The engine builds it (`engine.snapshot.cache_geometry`), a `junction attach` bridge builds the
peer's (`attach.attach_forward`), the hello carries it (`engine.wire.Hello.geometry`,
checked as the frame is decoded), the control plane's store keeps it as JSON (`engines.geometry`,
`msgspec.to_builtins`) and reads it back with `CacheGeometry.from_json`, the REST API serves
it (`GET /api/v1/engines/{id}`) and the dashboard reads that answer back into it
(`msgspec.convert`). Every field is optional: None means the producer does not report it (a
bridged vLLM or SGLang engine says nothing of match units; an engine says nothing of ranks),
and a field at its default is left out of the JSON.

Sizes are in tokens (docs/rules.md section 2): `Ba * D` the attention block, `Bm` the Mamba
block, `U` the match unit. A size is positive (the store divides by it); a count may be 0.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from engine.config import CheckpointMode
from engine.events import GROUPS, ID_PATTERN, INT64_MAX, Count, Count32, PeerGroup, Text

Size = Annotated[int, Meta(ge=1, le=INT64_MAX)]  # tokens of a block, a unit, a grid: > 0
MAX_GROUPS = 64  # groups one hello may describe
MAX_RANKS = 4096  # data-parallel ranks one bridge may name
Share = Annotated[float, Meta(ge=0.0, le=1.0)]  # a share of a pool
Kind = Annotated[str, Meta(min_length=1, max_length=64, pattern=ID_PATTERN)]
_SIZED_GROUPS = GROUPS  # the groups with a top-level `<group>_block_size`


class GroupShape(Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """One cache group's pool: its block size and, where the producer knows it, its size."""

    block_size: Size  # tokens per block of this group
    num_blocks: Count | None = None  # blocks in the pool (None: not reported)


class CacheGeometry(
    Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, gc=False
):
    """The hello's `geometry`: an engine's cache sizes and hit rules, or a bridge's peer."""

    # --- an engine's cache (`CacheConfig`, `SchedulerConfig`)
    block_size: Size | None = None  # `Ba`, the attention block before DCP
    attention_block_size: Size | None = None  # `Ba * D`
    mamba_block_size: Size | None = None  # `Bm`
    prefix_match_unit: Size | None = None  # `U`, the unit every hit is a multiple of
    dcp_size: Size | None = None  # `D`, decode context parallelism
    eagle: bool | None = None  # EAGLE drops one unit (or block) off attention hits
    partial_hits: bool | None = None  # hits inside a block; False: on `hit_alignment` only
    junction_checkpoints: bool | None = None  # Mamba states kept where prefixes part
    checkpoint_mode: CheckpointMode | None = None  # "stops" or "inline"
    checkpoint_interval: Count | None = None  # tokens between interval states (0: none)
    enable_prefix_caching: bool | None = None
    hit_alignment: Size | None = None  # the grid every hit length lies on
    max_model_len: Size | None = None  # the longest sequence the engine takes
    max_prefix_wait_steps: Count | None = None  # steps a request waits for a prefix in flight
    max_num_batched_tokens: Size | None = None  # the token budget of one step
    max_num_seqs: Size | None = None  # requests running at once
    long_prefill_threshold: Count | None = None  # a request's chunk cap (0: none)
    pin_max_share: Share | None = None  # the share of each group's blocks pins may hold
    eviction: Kind | None = None  # the eviction policy's name (`CacheConfig.eviction`)
    # each group's pool, so a store lays out a new epoch's table before any row comes
    groups: Annotated[dict[PeerGroup, GroupShape], Meta(max_length=MAX_GROUPS)] | None = None
    # the bytes each tier below the device may hold ("host", "disk", "shared"; None: none)
    tier_bytes: Annotated[dict[Kind, Count], Meta(max_length=8)] | None = None
    # --- a bridged vLLM or SGLang engine (`junction attach`)
    kind: Kind | None = None  # "vllm", "sglang": the peer's engine
    physical_block_ids: bool | None = None  # False: its events name blocks by hash alone
    ranks: Annotated[list[Count32], Meta(max_length=MAX_RANKS)] | None = None  # its DP ranks
    events: Text | None = None  # the ZeroMQ address of rank 0's events
    replay: Text | None = None  # rank 0's replay socket (None: none)
    metrics: Text | None = None  # the peer's Prometheus URL (None: none)

    @property
    def is_peer(self) -> bool:
        """An engine without physical block ids (a bridged vLLM or SGLang engine)."""
        return self.physical_block_ids is False

    def group(self, name: str) -> GroupShape | None:
        """The group's pool as the hello gives it, or None."""
        return (self.groups or {}).get(name)

    def group_block_size(self, name: str) -> int | None:
        """Tokens per block of group `name` (`attention`, `mamba`, ...): its pool's, else the
        top-level `<name>_block_size`; None when the hello gives neither."""
        shape = self.group(name)
        if shape is not None:
            return shape.block_size
        return getattr(self, f"{name}_block_size") if name in _SIZED_GROUPS else None

    def group_num_blocks(self, name: str) -> int | None:
        """Blocks in group `name`'s pool, or None when the hello does not say."""
        shape = self.group(name)
        return None if shape is None else shape.num_blocks

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, the fields at their defaults (not reported) left out."""
        return msgspec.to_builtins(self)

    @classmethod
    def from_json(cls, data: object) -> CacheGeometry:
        """A geometry from plain JSON (the store's column, the REST API's answer): keys it does
        not know are ignored, and so is a value its field would refuse (a row an older engine
        wrote), rather than failing; anything but an object is an empty geometry."""
        if isinstance(data, CacheGeometry):
            return data
        if not isinstance(data, dict):
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__struct_fields__}
        try:
            return msgspec.convert(known, cls, strict=False)
        except msgspec.ValidationError:
            kept = {}
            for key, value in known.items():
                try:
                    msgspec.convert({key: value}, cls, strict=False)
                except msgspec.ValidationError:
                    continue
                kept[key] = value
            return msgspec.convert(kept, cls, strict=False)
