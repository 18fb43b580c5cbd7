"""The grid at one block a cell: a row per block id of `[start, stop)`, its category, tokens,
checkpoint reason, references and last change, and the hover text that says them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from client.types import BlockGrid
from dashboard.grid.categories import (
    CACHED_FULL,
    CACHED_PARTIAL,
    CATEGORIES,
    COW_TARGET,
    FREE,
    IN_USE,
    PINNED,
)


def block_frame(grid: BlockGrid) -> pd.DataFrame:
    """One row per block id in `[start, stop)` of a grid at one block a cell, blocks without a
    row free; `category` codes index `CATEGORIES`. Destinations of the grid's copy links that
    are still held are copy-on-write targets (unless pinned)."""
    start, stop = grid.start, grid.stop
    n = max(stop - start, 0)
    ids = np.asarray(grid.block_id, dtype=np.int64)
    at = ids - start
    states = np.array([*grid.states, "?"])[np.asarray(grid.state, dtype=np.int64)]
    reasons = np.array([*grid.reasons, ""], dtype=object)
    reason_codes = np.array(
        [len(grid.reasons) if r is None else r for r in grid.checkpoint_reason],
        dtype=np.int64,
    )

    category = np.full(n, FREE, dtype=np.int8)
    row_category = np.full(len(ids), FREE, dtype=np.int8)
    partial = np.asarray(grid.is_partial, dtype=bool)
    row_category[(states == "cached") & ~partial] = CACHED_FULL
    row_category[(states == "cached") & partial] = CACHED_PARTIAL
    row_category[states == "in_use"] = IN_USE
    copied = {link.dst for link in grid.links if link.kind == "copy"}
    if copied:
        is_dst = np.isin(ids, np.fromiter(copied, dtype=np.int64))
        row_category[is_dst & (states != "free")] = COW_TARGET
    row_category[states == "pinned"] = PINNED
    category[at] = row_category

    frame = pd.DataFrame({"block_id": np.arange(start, start + n), "category": category})
    full = {
        "state": ("free", states),
        "ref_cnt": (0, grid.ref_cnt),
        "token_start": (None, grid.token_start),
        "token_end": (None, grid.token_end),
        "checkpoint_reason": ("", reasons[reason_codes]),
        "last_change": (None, grid.last_change),
    }
    for name, (empty, values) in full.items():
        column = np.full(n, empty, dtype=object)
        column[at] = np.asarray(values, dtype=object)
        frame[name] = column
    if grid.keys is not None:
        keys = np.full(n, "", dtype=object)
        keys[at] = [", ".join(k[:12] for k in row) for row in grid.keys]
        frame["keys"] = keys
    return frame


def block_hover(blocks: pd.DataFrame) -> list[str]:
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
