"""The engine's block table as JSON: the shape of the control plane's block-table endpoint.

`{"engine_id", "step", "geometry": {...}, "groups": {group: {"block_size", "num_blocks"}},
"blocks": [{"group", "block_id", "state", "keys", "token_range", "is_partial",
"checkpoint_reason", "ref_cnt", "pinned", "last_change"}, ...]}`; `token_range` is
`[start, end)` of the block's valid tokens, `null` for a block that holds no entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.engine import Engine


def geometry(engine: Engine) -> dict:
    config = engine.cache_config
    return {
        "block_size": config.block_size,
        "attention_block_size": config.attention_block_size,
        "mamba_block_size": config.mamba_block_size,
        "prefix_match_unit": config.match_unit,
        "dcp_size": config.dcp_size,
        "eagle": config.eagle,
        "partial_hits": config.partial_hits,
        "junction_checkpoints": config.junction_checkpoints,
        "checkpoint_mode": config.checkpoint_mode,
        "checkpoint_interval": config.state_interval,
        "enable_prefix_caching": config.enable_prefix_caching,
        "hit_alignment": config.hit_alignment,
        "max_model_len": engine.scheduler_config.max_model_len,
        "max_prefix_wait_steps": engine.scheduler_config.max_prefix_wait_steps,
    }


def block_table_snapshot(engine: Engine) -> dict:
    coordinator = engine.scheduler.coordinator
    blocks = []
    groups = {}
    for name, pool in coordinator.pools.items():
        groups[name] = {"block_size": pool.block_size, "num_blocks": pool.num_blocks}
        blocks.extend(pool.row(block) for block in pool.blocks)
    return {
        "engine_id": engine.engine_id,
        "step": engine.scheduler.step_id,
        "geometry": geometry(engine),
        "groups": groups,
        "blocks": blocks,
    }
