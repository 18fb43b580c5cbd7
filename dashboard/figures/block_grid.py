"""The block table as a grid: one heatmap cell per block (or per run of blocks), coloured by
category, with a request's blocks outlined, its hit boundary marked, and recent copies and
moves drawn as links from source to destination cell.

Cell `i` sits at column `i % width`, row `i // width`; each overlay is a trace of its own."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.grid.categories import CATEGORIES

CATEGORY_COLORS = {
    "free": "#e9ecef",
    "cached full": "#4c9be8",
    "cached partial": "#9cc9f5",
    "in use": "#f0a202",
    # neutral (a copy's lavender, not an error's red): a copy-on-write target is routine
    "copy-on-write target": "#b8a9c9",
    "pinned": "#2a9d5c",
}
LINK_COLORS = {"copy": "#6f2dbd", "move": "#6c757d"}
LINK_DASH = {"copy": "solid", "move": "dot"}
OUTLINE_COLOR = "#000000"
BOUNDARY_COLOR = "#ff006e"


def discrete_colorscale() -> list[list]:
    """Each category code `i` (z in `[i - 0.5, i + 0.5]`) gets its own flat colour."""
    n = len(CATEGORIES)
    scale = []
    for i, name in enumerate(CATEGORIES):
        scale.append([i / n, CATEGORY_COLORS[name]])
        scale.append([(i + 1) / n, CATEGORY_COLORS[name]])
    return scale


def block_grid_figure(
    cells: pd.DataFrame,
    width: int,
    blocks_per_cell: int = 1,
    first_block: int = 0,
    links: pd.DataFrame | None = None,
    outline: pd.DataFrame | None = None,
    boundary: pd.DataFrame | None = None,
    title: str = "",
) -> go.Figure:
    """`cells` has `cell`, `category` (code into `CATEGORIES`) and `hover`. `links` has `kind`,
    `src_cell`, `dst_cell` (one row an arrow, see `dashboard.grid.arrows`); `outline` a `cell`
    column; `boundary` `cell`, `frac` (where in the cell the hit ends) and `hit`."""
    num_cells = int(cells["cell"].max()) + 1 if len(cells) else 0
    num_rows = max(1, math.ceil(num_cells / width))
    fig = go.Figure(heatmap(cells, width, num_rows))
    if links is not None and len(links):
        fig.add_traces(link_traces(links, width))
    if outline is not None and len(outline):
        fig.add_trace(outline_trace(outline, width))
    if boundary is not None and len(boundary):
        fig.add_trace(boundary_trace(boundary, width))
    fig.update_layout(grid_layout(width, num_rows, blocks_per_cell, first_block, title))
    return fig


def heatmap(cells: pd.DataFrame, width: int, num_rows: int) -> go.Heatmap:
    """The cells, `num_rows` rows of `width`, coloured by category (the last row's tail blank)."""
    z = np.full(num_rows * width, np.nan)
    text = np.full(num_rows * width, "", dtype=object)
    z[cells["cell"].to_numpy()] = cells["category"].to_numpy()
    text[cells["cell"].to_numpy()] = cells["hover"].to_numpy()
    gap = 1 if not len(cells) or int(cells["cell"].max()) < 4096 else 0  # gaps hide small cells
    n = len(CATEGORIES)
    return go.Heatmap(
        z=z.reshape(num_rows, width),
        text=text.reshape(num_rows, width),
        hovertemplate="%{text}<extra></extra>",
        colorscale=discrete_colorscale(),
        zmin=-0.5,
        zmax=n - 0.5,
        xgap=gap,
        ygap=gap,
        name="blocks",
        colorbar={
            "title": {"text": "state"},
            "tickvals": list(range(n)),
            "ticktext": list(CATEGORIES),
            "lenmode": "pixels",
            "len": 220,
            "y": 1,
            "yanchor": "top",
        },
    )


def link_traces(links: pd.DataFrame, width: int) -> list[go.Scatter]:
    """A trace per link kind: an arrow from each source cell to its destination cell."""
    traces = []
    for kind, group in links.groupby("kind"):
        xs, ys = [], []
        for src, dst in zip(group["src_cell"], group["dst_cell"], strict=True):
            xs += [src % width, dst % width, None]
            ys += [src // width, dst // width, None]
        line = {"color": LINK_COLORS.get(kind, "#555"), "width": 2}
        line["dash"] = LINK_DASH.get(kind, "solid")
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                name=f"{kind} (src → dst)",
                line=line,
                marker={"symbol": "arrow", "angleref": "previous", "size": 10},
                hoverinfo="skip",
            )
        )
    return traces


def outline_trace(outline: pd.DataFrame, width: int) -> go.Scatter:
    """A square around each of the request's cells."""
    xs, ys = [], []
    for cell in outline["cell"]:
        x, y = cell % width, cell // width
        xs += [x - 0.5, x + 0.5, x + 0.5, x - 0.5, x - 0.5, None]
        ys += [y - 0.5, y - 0.5, y + 0.5, y + 0.5, y - 0.5, None]
    line = {"color": OUTLINE_COLOR, "width": 2}
    return go.Scatter(
        x=xs, y=ys, mode="lines", name="request's blocks", line=line, hoverinfo="skip"
    )


def boundary_trace(boundary: pd.DataFrame, width: int) -> go.Scatter:
    """A bar across the cell where the hit ends, `frac` of the way into it."""
    row = boundary.iloc[0]
    cell, hit = int(row["cell"]), int(row["hit"])
    x = cell % width - 0.5 + float(row["frac"])
    y = cell // width
    return go.Scatter(
        x=[x, x],
        y=[y - 0.6, y + 0.6],
        mode="lines",
        name=f"hit boundary (token {hit})",
        line={"color": BOUNDARY_COLOR, "width": 4},
        hoverinfo="name",
    )


def grid_layout(
    width: int, num_rows: int, blocks_per_cell: int, first_block: int, title: str
) -> dict:
    """Square cells about 900 px across, rows labelled by the block id they start at."""
    row_blocks = width * blocks_per_cell
    step = max(1, num_rows // 10)
    tick_rows = list(range(0, num_rows, step))
    return {
        "title": title,
        "height": int(min(1000, max(280, 150 + 900 * num_rows / width))),
        "margin": {"l": 70, "r": 20, "t": 70 if title else 40, "b": 50},
        "plot_bgcolor": "white",
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
        "xaxis": {
            "title": {"text": f"block offset in the row (× {blocks_per_cell} blocks a cell)"},
            "showgrid": False,
            "zeroline": False,
            "range": [-0.5, width - 0.5],
            "constrain": "domain",
        },
        "yaxis": {
            "title": {"text": "block id at the row's start"},
            "autorange": "reversed",
            "showgrid": False,
            "zeroline": False,
            "tickvals": tick_rows,
            "ticktext": [str(first_block + r * row_blocks) for r in tick_rows],
            "scaleanchor": "x",
            "constrain": "domain",
        },
    }
