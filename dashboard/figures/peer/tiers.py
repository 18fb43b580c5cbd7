"""The blocks each tier (GPU, CPU, storage) holds per cache group, from `GET .../peer-summary`."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import PeerSummary

MEDIUM_COLORS = {"GPU": "#4c9be8", "CPU": "#f0a202", "STORAGE": "#8e6cc2"}


def tiers_frame(summary: PeerSummary) -> pd.DataFrame:
    """Blocks per group and medium."""
    rows = [
        {"group": group, "medium": medium, "blocks": count}
        for group, media in summary.groups.items()
        for medium, count in media.items()
    ]
    return pd.DataFrame(rows, columns=["group", "medium", "blocks"])


def tiers_figure(frame: pd.DataFrame) -> go.Figure:
    """A horizontal bar per group, stacked by the medium holding its blocks."""
    fig = go.Figure()
    for medium in dict.fromkeys(frame["medium"]):
        part = frame[frame["medium"] == medium]
        fig.add_trace(
            go.Bar(
                y=part["group"],
                x=part["blocks"],
                name=str(medium),
                orientation="h",
                marker={"color": MEDIUM_COLORS.get(str(medium), "#adb5bd")},
                hovertemplate="%{y} · %{x:,} blocks in " + str(medium) + "<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=max(160, 70 + 40 * frame["group"].nunique()),
        margin={"l": 110, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "blocks"}},
        legend={"orientation": "h", "y": 1.2},
    )
    return fig
