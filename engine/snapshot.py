"""The engine's cache as its hello and its block table tell it: `cache_geometry` (the hello's
`CacheGeometry`) and `block_table_snapshot` (the JSON of `GET /debug/blocks` and `junction
replay --snapshot-out`):

`{"engine_id", "step", "geometry": {...}, "groups": {group: {"block_size", "num_blocks"}},
"blocks": [{"group", "block_id", "state", "keys", "token_range", "is_partial",
"checkpoint_reason", "ref_cnt", "pinned", "last_change"}, ...]}`; `geometry` is the hello's
(`groups` included), `token_range` is `[start, end)` of the block's valid tokens, `null` for a
block that holds no entry.

Plain functions of the configs and the pools, so they need no `Engine` (`Engine.snapshot` and
`Engine.cache_geometry` call them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from engine.config import CacheConfig, SchedulerConfig
from engine.geometry import CacheGeometry, GroupShape


class Pool(Protocol):
    """What the snapshot reads of a group's block pool."""

    block_size: int
    num_blocks: int

    @property
    def blocks(self) -> Iterable[Any]: ...

    def row(self, block: Any) -> dict: ...


def cache_geometry(
    cache: CacheConfig, scheduler: SchedulerConfig, pools: Mapping[str, Pool]
) -> CacheGeometry:
    """The hello's geometry of an engine with these configs and pools."""
    return CacheGeometry(
        block_size=cache.block_size,
        attention_block_size=cache.attention_block_size,
        mamba_block_size=cache.mamba_block_size,
        prefix_match_unit=cache.match_unit,
        dcp_size=cache.dcp_size,
        eagle=cache.eagle,
        partial_hits=cache.partial_hits,
        junction_checkpoints=cache.junction_checkpoints,
        checkpoint_mode=cache.checkpoint_mode,
        checkpoint_interval=cache.state_interval,
        enable_prefix_caching=cache.enable_prefix_caching,
        hit_alignment=cache.hit_alignment,
        max_model_len=scheduler.max_model_len,
        max_prefix_wait_steps=scheduler.max_prefix_wait_steps,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_num_seqs=scheduler.max_num_seqs,
        long_prefill_threshold=scheduler.long_prefill_threshold,
        pin_max_share=cache.pin_max_share,
        eviction=cache.eviction,
        groups={
            name: GroupShape(block_size=pool.block_size, num_blocks=pool.num_blocks)
            for name, pool in pools.items()
        },
    )


def block_table_snapshot(
    engine_id: str, step: int, geometry: CacheGeometry, pools: Mapping[str, Pool]
) -> dict:
    """Every block's row, with the engine's geometry, as plain JSON."""
    blocks = [pool.row(block) for pool in pools.values() for block in pool.blocks]
    plain = geometry.to_json()
    return {
        "engine_id": engine_id,
        "step": step,
        "geometry": plain,
        "groups": plain.get("groups", {}),
        "blocks": blocks,
    }
