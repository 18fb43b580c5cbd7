"""The cells a grid figure draws, from the block-grid endpoint's columns.

Every physical block of `[start, stop)` gets a category (free, cached full, cached partial,
in use, copy-on-write target, pinned). A browser draws a heatmap of some tens of thousands of
cells with hover text comfortably; above `MAX_CELLS` blocks the endpoint aggregates (in SQL)
consecutive blocks into one cell, which takes the most notable category among them (the order
of `CATEGORIES`) and counts the rest in its hover. The page says when it aggregates, and
offers a window at one block a cell.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from client.types import BlockGrid
from dashboard.grid.blocks import block_frame, block_hover
from dashboard.grid.categories import (
    CACHED_FULL,
    CACHED_PARTIAL,
    CATEGORIES,
    COW_TARGET,
    FREE,
    IN_USE,
    PINNED,
    category_of,
)

MAX_CELLS = 10_000


class Cells(NamedTuple):
    """`frame`: one row per cell (`cell`, `first_block`, `last_block`, `category`, `hover`);
    `blocks_per_cell` 1 unless aggregated; `width` cells per grid row; `start` the first
    block id drawn."""

    frame: pd.DataFrame
    blocks_per_cell: int
    width: int
    start: int

    @property
    def is_aggregated(self) -> bool:
        return self.blocks_per_cell > 1

    def cell_of(self, block_id: int) -> int | None:
        cell = (block_id - self.start) // self.blocks_per_cell
        return cell if 0 <= cell < len(self.frame) else None


def grid_cells(grid: BlockGrid) -> Cells:
    """The grid's cells: one a block, or, when the endpoint aggregated, one a run of
    `blocks_per_cell` blocks counted by category."""
    if grid.blocks_per_cell > 1:
        return _aggregated_cells(grid)
    blocks = block_frame(grid)
    frame = pd.DataFrame(
        {
            "cell": np.arange(len(blocks)),
            "first_block": blocks["block_id"].to_numpy(),
            "last_block": blocks["block_id"].to_numpy(),
            "category": blocks["category"].to_numpy(),
            "hover": block_hover(blocks),
        }
    )
    return Cells(frame, 1, _width(len(frame)), grid.start)


def _aggregated_cells(grid: BlockGrid) -> Cells:
    start, stop, per_cell = grid.start, grid.stop, grid.blocks_per_cell
    num_cells = -(-(stop - start) // per_cell)
    k = len(CATEGORIES)
    counts = np.zeros((num_cells, k), dtype=np.int64)
    counted = grid.cells
    at = np.asarray(counted.cell, dtype=np.int64)
    for code, name in (
        (PINNED, "num_pinned"),
        (IN_USE, "num_in_use"),
        (CACHED_FULL, "num_cached_full"),
        (CACHED_PARTIAL, "num_cached_partial"),
    ):
        counts[at, code] = getattr(counted, name)
    for link in grid.links:  # a held copy destination is a copy-on-write target
        cell = (link.dst - start) // per_cell
        if link.kind != "copy" or not 0 <= cell < num_cells:
            continue
        code = category_of(link.dst_state, link.dst_is_partial)
        if code not in (FREE, PINNED) and counts[cell, code] > 0:
            counts[cell, code] -= 1
            counts[cell, COW_TARGET] += 1
    first = start + np.arange(num_cells) * per_cell
    last = np.minimum(first + per_cell, stop) - 1
    counts[:, FREE] += (last - first + 1) - counts.sum(axis=1)  # blocks without a row
    top = k - 1 - np.argmax(counts[:, ::-1] > 0, axis=1)  # the highest category present
    hover = [
        f"blocks {a}-{b}<br>" + "<br>".join(f"{n} {CATEGORIES[c]}" for c, n in enumerate(row) if n)
        for a, b, row in zip(first.tolist(), last.tolist(), counts.tolist(), strict=True)
    ]
    frame = pd.DataFrame(
        {
            "cell": np.arange(num_cells),
            "first_block": first,
            "last_block": last,
            "category": top,
            "hover": hover,
        }
    )
    return Cells(frame, per_cell, _width(num_cells), start)


def _width(num_cells: int) -> int:
    """Cells a grid row: about twice as wide as tall."""
    return max(8, math.ceil(math.sqrt(2 * max(num_cells, 1))))
