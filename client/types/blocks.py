"""An engine's block table: rows by page (`GET /engines/{id}/blocks`) and one group's table as
columns for a grid (`/blocks/grid`)."""

from __future__ import annotations

from typing import Literal

from client.types.base import Body


class BlockOut(Body):
    """A row in `BlockPool.row`'s shape; `token_range` is `[start, end)` or None."""

    group: str
    block_id: int
    state: str
    keys: list[str]
    token_range: tuple[int | None, int] | None
    is_partial: bool
    checkpoint_reason: str | None
    ref_cnt: int
    pinned: bool
    last_change: int
    tier: str = "device"  # where the block lives: a block-table row is the device's


class BlockPage(Body):
    engine_id: str
    total: int
    offset: int
    limit: int
    blocks: list[BlockOut]
    note: str | None = None  # why the page is empty: an engine without physical block ids


class GridLink(Body):
    """A copy or a move of keys from block `src` to block `dst`; `seq` is its batch's."""

    kind: Literal["copy", "move"]
    src: int
    dst: int
    path: str | None
    request_id: str | None
    step: int | None
    seq: int
    dst_state: str | None
    dst_is_partial: bool | None


class CellCounts(Body):
    """Per cell with any row (`cell[i]`), its blocks by state; the rest of its blocks are free."""

    cell: list[int]
    num_pinned: list[int]
    num_in_use: list[int]
    num_cached_full: list[int]
    num_cached_partial: list[int]


class BlockGrid(Body):
    """Blocks `start <= block_id < stop` that have a row, as columns of equal length; `state`
    and `checkpoint_reason` index `states` and `reasons`. Past `max_cells` blocks,
    `blocks_per_cell` > 1, the per-block columns are empty and `cells` counts each cell."""

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
    note: str | None = None  # why the grid is empty: an engine without physical block ids


class TierUnitOut(Body):
    """A usable-hit unit in a tier below the device: `[start, end)` of attention and the
    state at `end`, keyed `H_end`."""

    tier: str
    key: str
    parent: str | None
    token_range: tuple[int, int]
    stored_at: float


class TierUsage(Body):
    num_units: int
    num_tokens: int
    capacity_bytes: int | None


class TierPage(Body):
    """`GET /engines/{id}/blocks/tiers`: each tier's usage and a page of its units."""

    engine_id: str
    tiers: dict[str, TierUsage]
    total: int
    offset: int
    limit: int
    units: list[TierUnitOut]
