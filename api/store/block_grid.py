"""One group's block table as columns, for drawing every block as a cell of a grid.

The grid reads the rows of `GET /engines/{id}/blocks` as parallel arrays (states and
checkpoint reasons as small integer codes with their legends), with each block's keys only on
request, and the copies and moves of the engine's most recent event batches, which the
dashboard draws as links between cells. Blocks without a row were never reported by the
engine: they are free.

Above `max_cells` blocks a browser cannot draw one cell a block, so the grid is aggregated
here, in SQL: `blocks_per_cell` consecutive blocks a cell, and for each cell the count of its
blocks by state (`cells`), instead of per-block columns. These reads change nothing.
"""

from __future__ import annotations

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from api.store.models import Block, Engine, EventBatch
from engine.wire import BLOCK_STATES, REASONS

LINK_EVENTS = {"BlockCopied": "copy", "BlockHashesMoved": "move"}
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


def block_grid(
    session: Session,
    engine: Engine,
    group: str,
    start: int,
    stop: int | None,
    keys: bool,
    max_cells: int | None,
    link_batches: int,
) -> dict:
    """The grid of blocks `[start, stop)` (`stop` None: the pool's size) as the JSON body of
    `api.routes.block_grid.BlockGrid`."""
    pool = engine.geometry.group(group)  # None: the hello does not describe the group
    where = [Block.engine_id == engine.engine_id, Block.group == group, Block.block_id >= start]
    if stop is not None:
        where.append(Block.block_id < stop)
    highest = session.scalar(select(func.max(Block.block_id)).where(*where[:2]))
    said = pool.num_blocks if pool is not None else None
    num_blocks = max(said or 0, -1 if highest is None else highest + 1)
    stop = num_blocks if stop is None else stop
    per_cell = 1
    if max_cells is not None and stop - start > max_cells:
        per_cell = -(-(stop - start) // max_cells)
    body = {
        "engine_id": engine.engine_id,
        "group": group,
        "block_size": pool.block_size if pool is not None else None,
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
        body |= _block_columns(session, where, keys)
    return body


def _block_columns(session: Session, where: list, keys: bool) -> dict:
    columns = [getattr(Block, name) for name in BLOCK_COLUMNS]
    if keys:
        columns.append(Block.keys)
    rows = session.execute(select(*columns).where(*where).order_by(Block.block_id)).all()
    state_code = {state: i for i, state in enumerate(BLOCK_STATES)}
    reason_code = {reason: i for i, reason in enumerate(REASONS)}
    body = {name: [row[i] for row in rows] for i, name in enumerate(BLOCK_COLUMNS)}
    body["state"] = [state_code.get(state, 0) for state in body["state"]]
    body["checkpoint_reason"] = [reason_code.get(r) for r in body["checkpoint_reason"]]
    if keys:
        body["keys"] = [row[-1] or [] for row in rows]
    return body


def _cell_counts(session: Session, where: list, start: int, per_cell: int) -> dict:
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


def _links(session: Session, engine: Engine, group: str, num_batches: int) -> list[dict]:
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
