"""Cache usage per group: blocks free, cached, in use and pinned, from `GET /engines/{id}`."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import EngineDetail

STATE_COLORS = {"free": "#e9ecef", "cached": "#4c9be8", "in use": "#f0a202", "pinned": "#2a9d5c"}
FIELDS = {
    "free": "num_free",
    "cached": "num_cached",
    "in use": "num_in_use",
    "pinned": "num_pinned",
}


def cache_usage_frame(engine: EngineDetail) -> pd.DataFrame:
    """One row per group and state: `blocks`, and `share` of the group's pool."""
    rows = []
    for group, usage in sorted(engine.cache.items()):
        for state, field in FIELDS.items():
            total = usage.num_blocks or 1
            rows.append(
                {
                    "group": group,
                    "state": state,
                    "blocks": getattr(usage, field),
                    "share": getattr(usage, field) / total,
                }
            )
    return pd.DataFrame(rows, columns=["group", "state", "blocks", "share"])


def cache_usage_figure(frame: pd.DataFrame) -> go.Figure:
    """A horizontal bar per group, stacked by state; x in blocks."""
    fig = go.Figure()
    for state, color in STATE_COLORS.items():
        part = frame[frame["state"] == state]
        fig.add_trace(
            go.Bar(
                y=part["group"],
                x=part["blocks"],
                name=state,
                orientation="h",
                marker={"color": color, "line": {"color": "#999", "width": 0.5}},
                customdata=part["share"],
                hovertemplate="%{y}: %{x} blocks " + state + " (%{customdata:.1%})<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=120 + 50 * max(1, frame["group"].nunique()),
        margin={"l": 80, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "blocks"}},
        legend={"orientation": "h", "y": 1.25},
    )
    return fig


def usage_text(engine: EngineDetail) -> str:
    """What an engine's pool usage means, per group: blocks in use or pinned over all blocks
    (what eviction cannot take), with the cached blocks counted apart (reusable prefixes,
    evictable), so a usage near 0 beside many cached blocks reads right."""
    usage, cached = [], []
    for group, pool in sorted(engine.cache.items()):
        held = pool.num_in_use + pool.num_pinned
        share = held / pool.num_blocks if pool.num_blocks else 0.0
        usage.append(f"{group} {share:.1%} ({held:,} of {pool.num_blocks:,})")
        cached.append(f"{group} {pool.num_cached:,}")
    if not usage:
        return "No cache reported yet."
    return (
        f"Usage = blocks in use or pinned / all blocks: {', '.join(usage)}. Cached blocks "
        f"hold reusable prefixes that eviction may take, counted apart: {', '.join(cached)}."
    )
