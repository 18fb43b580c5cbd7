"""The blocks each tier holds per cache group, from `GET .../peer-summary`: by the tier the
peer's medium names (device, host, disk, shared: `tiers`), as a Junction engine's views name
them, or by its raw medium from a control plane before tiers (`groups`)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import PeerSummary
from dashboard.figures.tiers import TIER_COLORS

MEDIUM_COLORS = {"GPU": "#4c9be8", "CPU": "#f0a202", "STORAGE": "#8e6cc2"} | TIER_COLORS


def tiers_frame(summary: PeerSummary) -> pd.DataFrame:
    """Blocks per group and tier (`medium`: the tier, or the raw medium without tiers)."""
    rows = [
        {"group": group, "medium": medium, "blocks": count}
        for group, media in (summary.tiers or summary.groups).items()
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
