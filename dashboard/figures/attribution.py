"""Miss attribution over time: why the tokens requests truly shared with earlier requests (the
online oracle) missed the cache, split by reason, per bucket of `GET /engines/{id}/attribution`.
The reasons' names and colours are `dashboard.figures.reasons`'.

hit + sum(missed by reason) = shared tokens, per bucket.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import AttributionOut
from dashboard.figures.hit_rate import time_axis
from dashboard.figures.reasons import HIT, REASONS, SHARED

BUCKET_COLUMNS = ["prompt_tokens", "hit_tokens", "shared_tokens", "oracle_tokens"]


def attribution_frame(attribution: AttributionOut) -> pd.DataFrame:
    """One row per bucket the API returned (a bucket without requests has none), oldest
    first: `time`, `bucket_s`, the token counts and the missed tokens in a column per reason."""
    rows = [
        {
            "time": pd.Timestamp(bucket.bucket_start, unit="s", tz="UTC"),
            "bucket_s": bucket.bucket_s,
            **{name: getattr(bucket, name) for name in BUCKET_COLUMNS},
            **{reason: bucket.missed_tokens.get(reason, 0) for reason in REASONS},
        }
        for bucket in attribution.buckets
    ]
    return pd.DataFrame(rows, columns=["time", "bucket_s", *BUCKET_COLUMNS, *REASONS])


def _steps(frame: pd.DataFrame, column: str) -> tuple[list, list]:
    """Each bucket's value held flat across it (points at its start and its end), and 0 over
    the gap to the next bucket when buckets without requests lie between."""
    x, y = [], []
    end = None
    for row in frame.itertuples(index=False):
        if end is not None and row.time > end:
            x += [end, row.time]
            y += [0, 0]
        end = row.time + pd.Timedelta(seconds=int(row.bucket_s))
        x += [row.time, end]
        y += [getattr(row, column)] * 2
    return x, y


def attribution_figure(frame: pd.DataFrame) -> go.Figure:
    """Hit and missed-by-reason as stacked areas (tokens per bucket), with the shared tokens
    (the online oracle) as a dashed line on top: the stack reaches it exactly."""
    fig = go.Figure()
    for column, series in [("hit_tokens", HIT), *REASONS.items()]:
        x, y = _steps(frame, column)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=f"{series.label}: {series.short}",
                mode="lines",
                stackgroup="tokens",
                line={"color": series.color, "width": 1},
                fillcolor=series.color,
                hovertemplate=f"%{{y:,}} tokens · {series.meaning}<extra>{series.label}</extra>",
            )
        )
    x, y = _steps(frame, "shared_tokens")
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            name=f"{SHARED.label}: {SHARED.short}",
            mode="lines",
            line={"color": SHARED.color, "width": 2.5, "dash": "dash"},
            hovertemplate=f"%{{y:,}} tokens · {SHARED.meaning}<extra>{SHARED.label}</extra>",
        )
    )
    fig.update_layout(
        height=340,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis=time_axis(frame),
        yaxis={"title": {"text": "prompt tokens per bucket"}, "rangemode": "tozero"},
        legend={"orientation": "v", "x": 1.02, "y": 1, "title": {"text": "shared tokens"}},
        hoverlabel={"namelength": -1},
    )
    return fig
