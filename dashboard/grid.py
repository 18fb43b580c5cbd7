"""From the block-grid endpoint's columns to the cells a grid figure draws.

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

#: Categories in rising notability: an aggregated cell shows the highest of its blocks'.
CATEGORIES = (
    "free",
    "cached full",
    "cached partial",
    "in use",
    "copy-on-write target",
    "pinned",
)
FREE, CACHED_FULL, CACHED_PARTIAL, IN_USE, COW_TARGET, PINNED = range(len(CATEGORIES))
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


def category_of(state: str, is_partial: bool) -> int:
    if state == "pinned":
        return PINNED
    if state == "in_use":
        return IN_USE
    if state == "cached":
        return CACHED_PARTIAL if is_partial else CACHED_FULL
    return FREE


def block_frame(grid: dict) -> pd.DataFrame:
    """One row per block id in `[start, stop)` of a grid at one block a cell, blocks without a
    row free; `category` codes index `CATEGORIES`. Destinations of the grid's copy links that
    are still held are copy-on-write targets (unless pinned)."""
    start, stop = grid["start"], grid["stop"]
    n = max(stop - start, 0)
    ids = np.asarray(grid["block_id"], dtype=np.int64)
    at = ids - start
    states = np.array([*grid["states"], "?"])[np.asarray(grid["state"], dtype=np.int64)]
    reasons = np.array([*grid["reasons"], ""], dtype=object)
    reason_codes = np.array(
        [len(grid["reasons"]) if r is None else r for r in grid["checkpoint_reason"]],
        dtype=np.int64,
    )

    category = np.full(n, FREE, dtype=np.int8)
    row_category = np.full(len(ids), FREE, dtype=np.int8)
    partial = np.asarray(grid["is_partial"], dtype=bool)
    row_category[(states == "cached") & ~partial] = CACHED_FULL
    row_category[(states == "cached") & partial] = CACHED_PARTIAL
    row_category[states == "in_use"] = IN_USE
    copied = {link["dst"] for link in grid["links"] if link["kind"] == "copy"}
    if copied:
        is_dst = np.isin(ids, np.fromiter(copied, dtype=np.int64))
        row_category[is_dst & (states != "free")] = COW_TARGET
    row_category[states == "pinned"] = PINNED
    category[at] = row_category

    frame = pd.DataFrame({"block_id": np.arange(start, start + n), "category": category})
    full = {
        "state": ("free", states),
        "ref_cnt": (0, grid["ref_cnt"]),
        "token_start": (None, grid["token_start"]),
        "token_end": (None, grid["token_end"]),
        "checkpoint_reason": ("", reasons[reason_codes]),
        "last_change": (None, grid["last_change"]),
    }
    for name, (empty, values) in full.items():
        column = np.full(n, empty, dtype=object)
        column[at] = np.asarray(values, dtype=object)
        frame[name] = column
    if grid.get("keys") is not None:
        keys = np.full(n, "", dtype=object)
        keys[at] = [", ".join(k[:12] for k in row) for row in grid["keys"]]
        frame["keys"] = keys
    return frame


def grid_cells(grid: dict) -> Cells:
    """The grid's cells: one a block, or, when the endpoint aggregated, one a run of
    `blocks_per_cell` blocks counted by category."""
    if grid.get("blocks_per_cell", 1) > 1:
        return _aggregated_cells(grid)
    blocks = block_frame(grid)
    frame = pd.DataFrame(
        {
            "cell": np.arange(len(blocks)),
            "first_block": blocks["block_id"].to_numpy(),
            "last_block": blocks["block_id"].to_numpy(),
            "category": blocks["category"].to_numpy(),
            "hover": _block_hover(blocks),
        }
    )
    return Cells(frame, 1, _width(len(frame)), grid["start"])


def _aggregated_cells(grid: dict) -> Cells:
    start, stop, per_cell = grid["start"], grid["stop"], grid["blocks_per_cell"]
    num_cells = -(-(stop - start) // per_cell)
    k = len(CATEGORIES)
    counts = np.zeros((num_cells, k), dtype=np.int64)
    counted = grid["cells"]
    at = np.asarray(counted["cell"], dtype=np.int64)
    for code, name in (
        (PINNED, "num_pinned"),
        (IN_USE, "num_in_use"),
        (CACHED_FULL, "num_cached_full"),
        (CACHED_PARTIAL, "num_cached_partial"),
    ):
        counts[at, code] = counted[name]
    for link in grid["links"]:  # a held copy destination is a copy-on-write target
        cell = (link["dst"] - start) // per_cell
        if link["kind"] != "copy" or not 0 <= cell < num_cells:
            continue
        code = category_of(link["dst_state"], link["dst_is_partial"])
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


def _block_hover(blocks: pd.DataFrame) -> list[str]:
    """A block's hover: its category, tokens, checkpoint reason, references and last change,
    or "free, never used" for a block no event has touched (no row in the grid)."""
    names = np.array(CATEGORIES, dtype=object)[blocks["category"].to_numpy()]
    keys = blocks["keys"] if "keys" in blocks else None
    hover = []
    for i, row in enumerate(blocks.itertuples(index=False)):
        if row.last_change is None and row.state == "free":
            hover.append(f"block {row.block_id} · free, never used")
            continue
        start = "?" if row.token_start is None else row.token_start
        tokens = "none" if row.token_end is None else f"[{start}, {row.token_end})"
        step = "never" if row.last_change is None else f"step {row.last_change}"
        text = (
            f"block {row.block_id} · {names[i]}<br>tokens {tokens}"
            f"<br>checkpoint {row.checkpoint_reason or 'none'} · refs {row.ref_cnt}"
            f"<br>last change: {step}"
        )
        if keys is not None:
            text += f"<br>keys {keys.iat[i] or 'none'}"
        hover.append(text)
    return hover


def link_frame(grid: dict, cells: Cells) -> pd.DataFrame:
    """The grid's copies and moves whose both ends are drawn, with their cells."""
    rows = []
    for link in grid["links"]:
        src, dst = cells.cell_of(link["src"]), cells.cell_of(link["dst"])
        if src is not None and dst is not None:
            rows.append({**link, "src_cell": src, "dst_cell": dst})
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
