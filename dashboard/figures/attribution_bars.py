"""The requests' miss attribution side by side: a bar per attributed request, its hit and
then what it missed by reason, stacked up to the tokens it truly shared, then the rest of its
prompt, which nothing before it shared (so a cold request is a full grey bar, not an empty
row)."""

from __future__ import annotations

import plotly.graph_objects as go

from client.types import RequestOut
from dashboard.figures.reasons import HIT, REASONS, SHARED, UNSHARED
from dashboard.figures.request_attribution import is_attributed


def requests_attribution_figure(requests: list[RequestOut]) -> go.Figure:
    """A bar per attributed request (newest on top): its hit, then what it missed by reason,
    stacked up to the tokens it truly shared (a diamond), then its unshared prompt tokens."""
    shown = [r for r in requests if is_attributed(r)][::-1]
    ids = [r.request_id for r in shown]
    fig = go.Figure()
    parts = [("hit", HIT, [r.num_cached_tokens for r in shown])]
    for reason, series in REASONS.items():
        parts.append((reason, series, [r.attribution.missed_tokens.get(reason, 0) for r in shown]))
    unshared = [max(r.num_prompt_tokens - r.attribution.shared_tokens, 0) for r in shown]
    parts.append(("unshared", UNSHARED, unshared))
    for _, series, values in parts:
        fig.add_trace(
            go.Bar(
                x=values,
                y=ids,
                orientation="h",
                name=series.label,
                marker={"color": series.color},
                hovertemplate=f"%{{y}}: %{{x:,}} tokens · {series.meaning}"
                f"<extra>{series.label}</extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[r.attribution.shared_tokens for r in shown],
            y=ids,
            mode="markers",
            name=SHARED.label,
            marker={"color": SHARED.color, "symbol": "diamond", "size": 9},
            hovertemplate=f"%{{y}}: %{{x:,}} tokens shared<extra>{SHARED.label}</extra>",
        )
    )
    fig.update_layout(
        barmode="stack",
        height=max(240, 22 * len(ids) + 110),
        margin={"l": 80, "r": 20, "t": 60, "b": 40},
        xaxis={"title": {"text": "prompt tokens"}, "rangemode": "tozero"},
        yaxis={"type": "category"},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
    )
    return fig
