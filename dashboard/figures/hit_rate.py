"""An engine's token hit rate over time (overall and per group) and its requests per second,
from the hit-rate buckets of `GET /engines/{id}/hit-rate`."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import HitRateOut

SERIES_COLORS = {"overall": "#1b1b1b", "attention": "#4c9be8", "mamba": "#2a9d5c"}
COLUMNS = [
    "time",
    "bucket_s",
    "series",
    "hit_rate",
    "requests_per_s",
    "num_requests",
    "prompt_tokens",
    "cached_tokens",
]


def hit_rate_frame(hit_rate: HitRateOut) -> pd.DataFrame:
    """Long form: one row per bucket and series (overall, then each group)."""
    rows = []
    for bucket in hit_rate.buckets:
        time = pd.Timestamp(bucket.bucket_start, unit="s", tz="UTC")
        common = {
            "time": time,
            "bucket_s": bucket.bucket_s,
            "requests_per_s": bucket.num_requests / bucket.bucket_s,
            "num_requests": bucket.num_requests,
            "prompt_tokens": bucket.prompt_tokens,
            "cached_tokens": bucket.cached_tokens,
        }
        rows.append({**common, "series": "overall", "hit_rate": bucket.hit_rate})
        for group, rate in sorted(bucket.hit_rate_by_group.items()):
            rows.append({**common, "series": group, "hit_rate": rate})
    return pd.DataFrame(rows, columns=COLUMNS)


def time_axis(frame: pd.DataFrame) -> dict:
    """Minutes on the axis, and at least a bucket of room on each side of the buckets (a frame
    with `time` and `bucket_s` columns: the hit-rate and attribution buckets)."""
    axis = {"title": {"text": "time (UTC, bucket start)"}, "tickformat": "%H:%M:%S"}
    if len(frame):
        pad = pd.Timedelta(seconds=int(frame["bucket_s"].max()))
        axis["range"] = [frame["time"].min() - pad, frame["time"].max() + 2 * pad]
    return axis


def marker_sizes(prompt_tokens: pd.Series, smallest: float, largest: float) -> list[float]:
    """A bucket's marker grows with its prompt tokens (its area in proportion), so a bucket of
    one 27-token request that hit nothing reads as the speck it is beside thousands of tokens."""
    most = float(prompt_tokens.max()) if len(prompt_tokens) else 0.0
    if most <= 0:
        return [smallest] * len(prompt_tokens)
    return [smallest + (largest - smallest) * (float(t) / most) ** 0.5 for t in prompt_tokens]


def hit_rate_figure(frame: pd.DataFrame) -> go.Figure:
    """A line per series; y in percent of prompt tokens, each bucket's marker sized by its
    prompt tokens (the hover says how many, and how many requests). The groups go first and
    the overall line last, dashed and thicker, so it stays visible on top of a group line it
    equals (the Mamba hit is often the whole hit); the legend still lists it first."""
    fig = go.Figure()
    groups = list(dict.fromkeys(frame["series"]))
    for series in [s for s in groups if s != "overall"] + [s for s in groups if s == "overall"]:
        group = frame[frame["series"] == series]
        is_overall = series == "overall"
        fig.add_trace(
            go.Scatter(
                x=group["time"],
                y=group["hit_rate"],
                mode="lines+markers",
                name=str(series),
                legendrank=1 if is_overall else 1000,
                line={
                    "color": SERIES_COLORS.get(str(series), "#888"),
                    "width": 3 if is_overall else 2,
                    "dash": "dash" if is_overall else "solid",
                },
                marker={
                    "size": marker_sizes(
                        group["prompt_tokens"], *((4, 10) if is_overall else (5, 14))
                    ),
                    "symbol": "diamond" if is_overall else "circle",
                },
                customdata=group[["prompt_tokens", "num_requests"]].to_numpy(),
                hovertemplate="%{x}<br>%{y:.1%} of %{customdata[0]:,} prompt tokens "
                "(%{customdata[1]:.0f} requests)<extra>" + str(series) + "</extra>",
            )
        )
    fig.update_layout(
        height=300,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis=time_axis(frame),
        yaxis={"title": {"text": "token hit rate (%)"}, "tickformat": ".0%", "range": [0, 1.05]},
        legend={"orientation": "h", "y": 1.12},
    )
    return fig


def requests_rate_figure(frame: pd.DataFrame) -> go.Figure:
    """Requests per second in each bucket."""
    overall = frame[frame["series"] == "overall"]
    fig = go.Figure(
        go.Bar(
            x=overall["time"] + pd.to_timedelta(overall["bucket_s"] / 2, unit="s"),
            y=overall["requests_per_s"],
            width=overall["bucket_s"] * 1000 * 0.9,  # a bucket wide (ms on a date axis)
            name="requests/s",
            marker={"color": "#f0a202"},
            hovertemplate="%{x}<br>%{y:.2f} requests/s<extra></extra>",
        )
    )
    fig.update_layout(
        height=240,
        margin={"l": 60, "r": 20, "t": 20, "b": 40},
        xaxis=time_axis(overall),
        yaxis={"title": {"text": "requests/s"}},
    )
    return fig
