"""One group's block table as columns, for drawing every block as a cell of a grid.

`GET /engines/{id}/blocks` pages rows as objects, which at 100,000 blocks is megabytes of
repeated field names and a pydantic model per row. The grid reads the same rows as parallel
arrays (states and checkpoint reasons as small integer codes with their legends), with each
block's keys only on request, and the copies and moves of the engine's most recent event
batches, which the dashboard draws as links between cells. Blocks without a row were never
reported by the engine: they are free.

Above `max_cells` blocks a browser cannot draw one cell a block, so the grid is aggregated
here, in SQL: `blocks_per_cell` consecutive blocks a cell, and for each cell the count of its
blocks by state (`cells`), instead of per-block columns.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel
from sqlalchemy import case, func, select

from api.deps import EngineDep, SessionDep
from api.models import Block, EventBatch
from engine.wire import BLOCK_STATES, REASONS, Group

router = APIRouter(prefix="/engines/{engine_id}/blocks", tags=["blocks"])
LINK_EVENTS = {"BlockCopied": "copy", "BlockHashesMoved": "move"}
MAX_LINK_BATCHES = 1000


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


@router.get("/grid", response_model=BlockGrid)
def block_grid(
    engine: EngineDep,
    session: SessionDep,
    group: Group = "attention",
    start: Annotated[int, Query(ge=0)] = 0,
    stop: Annotated[int | None, Query(ge=0, description="default: the pool's size")] = None,
    keys: bool = False,
    max_cells: Annotated[int | None, Query(ge=1, description="aggregate above this")] = None,
    link_batches: Annotated[int, Query(ge=0, le=MAX_LINK_BATCHES)] = 64,
) -> Response:
    """The grid's columns, serialized without a model per row (the response is `BlockGrid`)."""
    geometry = (engine.geometry or {}).get("groups", {}).get(group, {})
    where = [Block.engine_id == engine.engine_id, Block.group == group, Block.block_id >= start]
    if stop is not None:
        where.append(Block.block_id < stop)
    highest = session.scalar(select(func.max(Block.block_id)).where(*where[:2]))
    num_blocks = geometry.get("num_blocks")
    num_blocks = max(
        num_blocks if isinstance(num_blocks, int) else 0, -1 if highest is None else highest + 1
    )
    stop = num_blocks if stop is None else stop
    per_cell = 1
    if max_cells is not None and stop - start > max_cells:
        per_cell = -(-(stop - start) // max_cells)
    state_code = {state: i for i, state in enumerate(BLOCK_STATES)}
    body = {
        "engine_id": engine.engine_id,
        "group": group,
        "block_size": geometry.get("block_size"),
        "num_blocks": num_blocks,
        "start": start,
        "stop": stop,
        "blocks_per_cell": per_cell,
        "cells": None,
        "states": list(BLOCK_STATES),
        "reasons": list(REASONS),
        "keys": None,
        "links": _links(session, engine, group, link_batches),
    }
    if per_cell > 1:
        body |= dict.fromkeys(BLOCK_COLUMNS, [])
        body["cells"] = _cell_counts(session, where, start, per_cell)
    else:
        body |= _block_columns(session, where, keys, state_code)
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


BLOCK_COLUMNS = (
    "block_id",
    "state",
    "is_partial",
    "ref_cnt",
    "token_start",
    "token_end",
    "checkpoint_reason",
    "last_change",
)


def _block_columns(session, where: list, keys: bool, state_code: dict[str, int]) -> dict:
    columns = [getattr(Block, name) for name in BLOCK_COLUMNS]
    if keys:
        columns.append(Block.keys)
    rows = session.execute(select(*columns).where(*where).order_by(Block.block_id)).all()
    reason_code = {reason: i for i, reason in enumerate(REASONS)}
    body = {name: [row[i] for row in rows] for i, name in enumerate(BLOCK_COLUMNS)}
    body["state"] = [state_code.get(state, 0) for state in body["state"]]
    body["checkpoint_reason"] = [reason_code.get(r) for r in body["checkpoint_reason"]]
    if keys:
        body["keys"] = [row[-1] or [] for row in rows]
    return body


def _cell_counts(session, where: list, start: int, per_cell: int) -> dict:
    cell = ((Block.block_id - start) // per_cell).label("cell")
    cached = Block.state == "cached"
    counts = {
        "num_pinned": Block.state == "pinned",
        "num_in_use": Block.state == "in_use",
        "num_cached_full": cached & ~Block.is_partial,
        "num_cached_partial": cached & Block.is_partial,
    }
    sums = [func.sum(case((condition, 1), else_=0)) for condition in counts.values()]
    rows = session.execute(select(cell, *sums).where(*where).group_by(cell).order_by(cell)).all()
    body = {"cell": [row[0] for row in rows]}
    for i, name in enumerate(counts, start=1):
        body[name] = [int(row[i]) for row in rows]
    return body


def _links(session: SessionDep, engine: EngineDep, group: str, num_batches: int) -> list[dict]:
    """Copies and moves of `group` in the engine's last `num_batches` batches, oldest first."""
    if num_batches == 0:
        return []
    batches = session.execute(
        select(EventBatch.seq, EventBatch.events)
        .where(EventBatch.engine_id == engine.engine_id, EventBatch.epoch == engine.epoch)
        .order_by(EventBatch.seq.desc())
        .limit(num_batches)
    ).all()
    links = []
    for seq, events in reversed(batches):
        for event in events:
            kind = LINK_EVENTS.get(event.get("type"))
            if kind is None or event.get("group") != group:
                continue
            links.append(
                {
                    "kind": kind,
                    "src": event["src_block_id"],
                    "dst": event["dst_block_id"],
                    "path": event.get("path"),
                    "request_id": event.get("request_id"),
                    "step": event.get("step"),
                    "seq": seq,
                }
            )
    destinations = {
        block_id: (state, is_partial)
        for block_id, state, is_partial in session.execute(
            select(Block.block_id, Block.state, Block.is_partial).where(
                Block.engine_id == engine.engine_id,
                Block.group == group,
                Block.block_id.in_({link["dst"] for link in links}),
            )
        )
    }
    for link in links:
        link["dst_state"], link["dst_is_partial"] = destinations.get(link["dst"], ("free", False))
    return links
