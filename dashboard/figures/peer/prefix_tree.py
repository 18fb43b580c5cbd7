"""The cached prefix tree drawn: each node a bar from its start to its end position, its
children joined to its end, the Mamba states on it and the suggested junctions where a state
would save the most."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import PeerJunctionOut

STATE_COLOR = "#2a9d5c"
JUNCTION_COLOR = "#d62828"


def prefix_tree_figure(
    frame: pd.DataFrame, junctions: list[PeerJunctionOut] | None = None
) -> go.Figure:
    """Each node a bar from its start to its end position (tokens), its children joined to
    its end; Mamba states as green diamonds, suggested junctions as red crosses."""
    by_id = frame.set_index("node_id")
    bars_x: list[float | None] = []
    bars_y: list[float | None] = []
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for row in frame.itertuples():
        bars_x += [row.start, row.end, None]
        bars_y += [row.lane, row.lane, None]
        if row.parent_id is not None and row.parent_id in by_id.index:
            parent = by_id.loc[row.parent_id]
            links_x += [parent["end"], row.start, None]
            links_y += [parent["lane"], row.lane, None]
    fig = go.Figure()
    fig.add_trace(_lines(links_x, links_y, "#adb5bd", 1.5, "branch"))
    fig.add_trace(_lines(bars_x, bars_y, "#4c9be8", 9, "cached prefix"))
    fig.add_trace(
        go.Scatter(
            x=(frame["start"] + frame["end"]) / 2,
            y=frame["lane"],
            mode="markers",
            marker={"size": 14, "opacity": 0},
            showlegend=False,
            customdata=frame[["start", "end", "num_blocks", "num_leaves", "num_hidden_children"]],
            text=frame["mediums"].map(lambda m: ", ".join(m or ())),
            hovertemplate=(
                "tokens %{customdata[0]:,}-%{customdata[1]:,}<br>%{customdata[2]:,} blocks · "
                "%{customdata[3]:,} cached prefixes below<br>%{customdata[4]} more branches "
                "not drawn<br>held in %{text}<extra></extra>"
            ),
        )
    )
    states = [(p, row.lane) for row in frame.itertuples() for p in (row.states or ())]
    fig.add_trace(
        go.Scatter(
            x=[p for p, _ in states],
            y=[lane for _, lane in states],
            mode="markers",
            name="Mamba state",
            marker={"symbol": "diamond", "size": 11, "color": STATE_COLOR},
            hovertemplate="Mamba state at %{x:,}<extra></extra>",
        )
    )
    lane_at = {int(row.end): int(row.lane) for row in frame.itertuples()}
    shown = [j for j in junctions or [] if j.position in lane_at]
    fig.add_trace(
        go.Scatter(
            x=[j.position for j in shown],
            y=[lane_at[j.position] for j in shown],
            mode="markers",
            name="suggested junction",
            marker={"symbol": "x", "size": 13, "color": JUNCTION_COLOR},
            customdata=[[j.num_prefixes, j.tokens_saved] for j in shown],
            hovertemplate=(
                "junction at %{x:,}: %{customdata[0]} prefixes part here, a state would save "
                "%{customdata[1]:,} tokens each<extra></extra>"
            ),
        )
    )
    num_lanes = int(frame["lane"].max()) + 1 if len(frame) else 1
    fig.update_layout(
        height=min(900, 160 + 26 * num_lanes),
        margin={"l": 40, "r": 20, "t": 50, "b": 40},
        xaxis={"title": {"text": "position (tokens)"}, "rangemode": "tozero"},
        yaxis={"visible": False, "autorange": "reversed"},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
    )
    return fig


def _lines(x: list, y: list, color: str, width: float, name: str) -> go.Scatter:
    return go.Scatter(
        x=x, y=y, mode="lines", name=name, line={"color": color, "width": width}, hoverinfo="skip"
    )
