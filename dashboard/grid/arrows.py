"""The grid's copies and moves as arrows between cells: the links whose both ends are drawn,
one arrow for all the links between the same two cells, the newest few."""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import pandas as pd

from client.types import BlockGrid
from dashboard.grid.cells import Cells


def link_frame(grid: BlockGrid, cells: Cells) -> pd.DataFrame:
    """The grid's copies and moves whose both ends are drawn, with their cells."""
    rows = []
    for link in grid.links:
        src, dst = cells.cell_of(link.src), cells.cell_of(link.dst)
        if src is not None and dst is not None:
            rows.append({**msgspec.structs.asdict(link), "src_cell": src, "dst_cell": dst})
    columns = ["kind", "src", "dst", "path", "request_id", "step", "seq", "src_cell", "dst_cell"]
    return pd.DataFrame(rows, columns=columns)


#: Arrows a grid draws at most: more pile into a tangle nobody can follow.
MAX_ARROWS = 24


class Arrows(NamedTuple):
    """`frame`: one row an arrow (`kind`, `src_cell`, `dst_cell`, `num_links` it stands for,
    `seq` of its newest link), newest last; `num_links` the links considered (all, or the
    request's); `num_hidden` those of them no drawn arrow stands for."""

    frame: pd.DataFrame
    num_links: int
    num_hidden: int


def arrows(links: pd.DataFrame, request_id: str = "", max_arrows: int = MAX_ARROWS) -> Arrows:
    """The arrows to draw for `links` (from `link_frame`): one for all the links between the
    same two cells, only `request_id`'s links when it has any, the `max_arrows` newest.
    This does not change `links`."""
    if request_id and (links["request_id"] == request_id).any():
        links = links[links["request_id"] == request_id]
    columns = ["kind", "src_cell", "dst_cell", "num_links", "seq"]
    if not len(links):
        return Arrows(pd.DataFrame(columns=columns), 0, 0)
    grouped = (
        links.groupby(["kind", "src_cell", "dst_cell"], as_index=False)
        .agg(num_links=("seq", "size"), seq=("seq", "max"))
        .sort_values("seq", kind="stable")
        .tail(max_arrows)
        .reset_index(drop=True)
    )
    return Arrows(grouped[columns], len(links), len(links) - int(grouped["num_links"].sum()))
