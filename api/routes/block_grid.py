"""One group's block table as columns, for drawing every block as a cell of a grid.

`GET /engines/{id}/blocks` pages rows as objects, which at 100,000 blocks is megabytes of
repeated field names and a pydantic model per row. The grid (`api.store.block_grid` reads it) is
the same rows as parallel arrays, aggregated into cells above `max_cells` blocks, with the
copies and moves of the engine's most recent event batches as links between cells.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from api.deps import MAX_INT64, READ, EngineDep, SessionDep
from api.openapi import ENGINE_NOT_FOUND
from api.routes.blocks import no_block_ids_note
from api.store import block_grid as grid
from engine.wire import ATTENTION, BLOCK_STATES, REASONS, Group

router = APIRouter(
    prefix="/engines/{engine_id}/blocks",
    tags=["blocks"],
    dependencies=[READ],
    responses=ENGINE_NOT_FOUND,
)
MAX_LINK_BATCHES = 1000
# The store keeps block ids as 32-bit integers (`Block.block_id`): a larger start or stop could
# name no block, and would fail in PostgreSQL's comparison (a 500) rather than find none.
MAX_BLOCK_ID = 2**31 - 1


class GridLink(BaseModel):
    """A copy (`BlockCopied`, `path` consumer or producer) or a move of keys
    (`BlockHashesMoved`) from block `src` to block `dst`; `seq` is its batch's."""

    kind: Literal["copy", "move"]
    src: int
    dst: int
    path: str | None
    request_id: str | None
    step: int | None
    seq: int
    dst_state: str | None
    dst_is_partial: bool | None


class CellCounts(BaseModel):
    """Per cell with any row (`cell[i]`, in order), its blocks by state: pinned, in use,
    cached with a full entry, cached with a partial one. The rest of its blocks are free."""

    cell: list[int]
    num_pinned: list[int]
    num_in_use: list[int]
    num_cached_full: list[int]
    num_cached_partial: list[int]


class BlockGrid(BaseModel):
    """Blocks with `start <= block_id < stop` that have a row, in block id order, as columns
    of equal length; `state` and `checkpoint_reason` index `states` and `reasons` (null: no
    entry). `num_blocks` is the pool's size (from the engine's hello), `keys` is null unless
    asked for. `links` come from the last `link_batches` batches of the engine's epoch, each
    with its destination's current `dst_state` and `dst_is_partial`. When the range holds more
    than `max_cells` blocks, `blocks_per_cell` > 1, the per-block columns are empty and
    `cells` counts the blocks of each cell (cell `c` covers blocks `start + c * k` on)."""

    engine_id: str
    group: str
    block_size: int | None
    num_blocks: int
    start: int
    stop: int
    blocks_per_cell: int
    cells: CellCounts | None
    states: list[str]
    reasons: list[str]
    block_id: list[int]
    state: list[int]
    is_partial: list[bool]
    ref_cnt: list[int]
    token_start: list[int | None]
    token_end: list[int | None]
    checkpoint_reason: list[int | None]
    last_change: list[int]
    keys: list[list[str]] | None
    links: list[GridLink]
    # why the grid is empty: an engine without physical block ids (`/peer-blocks` has its cache)
    note: str | None = None


@router.get("/grid", response_model=BlockGrid)
def block_grid(
    engine: EngineDep,
    session: SessionDep,
    group: Group = ATTENTION,
    start: Annotated[int, Query(ge=0, le=MAX_BLOCK_ID)] = 0,
    stop: Annotated[
        int | None, Query(ge=0, le=MAX_BLOCK_ID, description="default: the pool's size")
    ] = None,
    keys: bool = False,
    max_cells: Annotated[
        int | None, Query(ge=1, le=MAX_INT64, description="aggregate above this")
    ] = None,
    link_batches: Annotated[int, Query(ge=0, le=MAX_LINK_BATCHES)] = 64,
) -> Response:
    """The grid's columns, serialized without a model per row (the response is `BlockGrid`).
    An engine without physical block ids has no grid: an empty one with a `note`."""
    if engine.geometry.is_peer:
        body = _empty_grid(engine.engine_id, group, start)
    else:
        body = grid.block_grid(session, engine, group, start, stop, keys, max_cells, link_batches)
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


def _empty_grid(engine_id: str, group: str, start: int) -> dict:
    columns = dict.fromkeys(grid.BLOCK_COLUMNS, [])
    return BlockGrid(
        **columns,
        engine_id=engine_id,
        group=group,
        block_size=None,
        num_blocks=0,
        start=start,
        stop=start,
        blocks_per_cell=1,
        cells=None,
        states=list(BLOCK_STATES),
        reasons=list(REASONS),
        keys=None,
        links=[],
        note=no_block_ids_note(engine_id),
    ).model_dump()
