"""An engine's block table as the store holds it, in `BlockPool.row`'s shape (every row a
device block), and the units its tiers below the device hold (`/blocks/tiers`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from api.deps import READ, EngineDep, Offset, SessionDep
from api.openapi import ENGINE_NOT_FOUND
from api.schemas import BlockOut, BlockPage, TierPage, TierUnitOut, TierUsage
from api.store import blocks
from api.store import tier_units as tier_reads
from api.store.models import Block, TierUnit
from engine.wire import BlockState, Group

router = APIRouter(
    prefix="/engines/{engine_id}/blocks",
    tags=["blocks"],
    dependencies=[READ],
    responses=ENGINE_NOT_FOUND,
)
MAX_LIMIT = 10_000


@router.get("", response_model=BlockPage)
def list_blocks(
    engine: EngineDep,
    session: SessionDep,
    group: Group | None = None,
    state: BlockState | None = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 1000,
) -> BlockPage:
    """Rows ordered by group, then block id; `group` and `state` filter them. An engine without
    physical block ids has none (its cache is `/peer-blocks`): an empty page with a `note`."""
    if engine.geometry.is_peer:
        return BlockPage(
            engine_id=engine.engine_id,
            total=0,
            offset=offset,
            limit=limit,
            blocks=[],
            note=no_block_ids_note(engine.engine_id),
        )
    total, rows = blocks.block_page(session, engine.engine_id, group, state, offset, limit)
    return BlockPage(
        engine_id=engine.engine_id,
        total=total,
        offset=offset,
        limit=limit,
        blocks=[block_out(row) for row in rows],
    )


@router.get("/tiers", response_model=TierPage)
def list_tier_units(
    engine: EngineDep,
    session: SessionDep,
    tier: Literal["host", "disk", "shared"] | None = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 1000,
) -> TierPage:
    """Where the engine's blocks live below the device: each tier's units and tokens now (the
    engine's `tier_bytes` their capacity), and a page of its units by tier then token range;
    `tier` (`host`, `disk`, `shared`) filters the page. A bridged engine's tiers are its
    `/peer-blocks` media."""
    capacity = engine.geometry.tier_bytes or {}
    held = tier_reads.usage(session, engine.engine_id)
    tiers = {
        name: TierUsage(
            num_units=held.get(name, (0, 0))[0],
            num_tokens=held.get(name, (0, 0))[1],
            capacity_bytes=capacity.get(name),
        )
        for name in dict.fromkeys([*capacity, *held])
    }
    total, rows = tier_reads.unit_page(session, engine.engine_id, tier, offset, limit)
    return TierPage(
        engine_id=engine.engine_id,
        tiers=tiers,
        total=total,
        offset=offset,
        limit=limit,
        units=[tier_unit_out(row) for row in rows],
    )


def tier_unit_out(row: TierUnit) -> TierUnitOut:
    return TierUnitOut(
        tier=row.tier,
        key=row.unit_key,
        parent=row.parent_key,
        token_range=(row.token_start, row.token_end),
        stored_at=row.stored_ts,
    )


def no_block_ids_note(engine_id: str) -> str:
    return (
        f"engine {engine_id!r} has no physical block ids: its cache is hash-keyed, at "
        f"/api/v1/engines/{engine_id}/peer-blocks"
    )


def block_out(row: Block) -> BlockOut:
    token_range = (row.token_start, row.token_end) if row.token_end is not None else None
    return BlockOut(
        group=row.group,
        block_id=row.block_id,
        state=row.state,
        keys=row.keys,
        token_range=token_range,
        is_partial=row.is_partial,
        checkpoint_reason=row.checkpoint_reason,
        ref_cnt=row.ref_cnt,
        pinned=row.pinned,
        last_change=row.last_change,
    )
