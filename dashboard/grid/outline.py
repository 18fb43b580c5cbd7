"""A request's blocks on the grid: the cells its block table holds in one group, and where its
hit boundary falls."""

from __future__ import annotations

import pandas as pd

from dashboard.grid.cells import Cells


def request_outline(
    block_ids: list[int | None], hit: int, block_size: int, cells: Cells
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cells of a request's blocks in one group, and where its hit boundary falls: the
    block of its table that holds token `hit` (or the end of its last block), with the
    fraction of that block before the boundary."""
    held = [
        (index, block, cells.cell_of(block))
        for index, block in enumerate(block_ids)
        if block is not None
    ]
    outline = pd.DataFrame(
        [(index, block, cell) for index, block, cell in held if cell is not None],
        columns=["index", "block_id", "cell"],
    )
    index, frac = divmod(hit, block_size) if block_size else (0, 0)
    frac = frac / block_size if block_size else 0.0
    if index >= len(block_ids) and block_ids:
        index, frac = len(block_ids) - 1, 1.0
    boundary = pd.DataFrame(columns=["block_id", "cell", "frac", "hit"])
    if 0 <= index < len(block_ids) and block_ids[index] is not None:
        cell = cells.cell_of(block_ids[index])
        if cell is not None:
            if cells.is_aggregated:
                frac = 0.5
            boundary = pd.DataFrame(
                [{"block_id": block_ids[index], "cell": cell, "frac": frac, "hit": hit}]
            )
    return outline, boundary
