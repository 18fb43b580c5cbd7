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
        "enable_prefix_caching": config.enable_prefix_caching,
    }


def block_table_snapshot(engine: Engine) -> dict:
    coordinator = engine.scheduler.coordinator
    blocks = []
    groups = {}
    for name, pool in coordinator.pools.items():
        groups[name] = {"block_size": pool.block_size, "num_blocks": pool.num_blocks}
        for block in pool.blocks:
            entries = [pool.entries[key] for key in block.keys]
            end = max((e.position for e in entries), default=None)
            reason = max(entries, key=lambda e: e.reason.retention).reason if entries else None
            blocks.append(
                {
                    "group": name,
                    "block_id": block.block_id,
                    "state": block.state,
                    "keys": [key.hex() for key in block.keys],
                    "token_range": [block.token_start, end] if end is not None else None,
                    "is_partial": end is not None and end % pool.block_size != 0,
                    "checkpoint_reason": reason.value if reason is not None else None,
                    "ref_cnt": block.ref_cnt,
                    "pinned": block.pin_cnt > 0,
                    "last_change": block.last_change,
                }
            )
    return {
        "engine_id": engine.engine_id,
        "step": engine.scheduler.step_id,
        "geometry": geometry(engine),
        "groups": groups,
        "blocks": blocks,
    }
