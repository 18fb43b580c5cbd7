"""A benchmark run's results by mode: token hit rate against the oracle (and the bound under
memory, for runs that measured it), and TTFT."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import BenchmarkRunOut

COLUMNS = [
    "mode",
    "num_requests",
    "hit_rate",
    "oracle_hit_rate",
    "bound_hit_rate",
    "computed_tokens",
    "forward_passes",
    "cow_copies",
    "ttft_median_ms",
    "ttft_p99_ms",
    "throughput_tok_s",
    "wall_s",
]


def modes_frame(run: BenchmarkRunOut) -> pd.DataFrame:
    """One row per mode of a finished run, TTFTs in milliseconds."""
    rows = []
    for mode in run.modes:
        rows.append(
            {
                **{name: getattr(mode, name, None) for name in COLUMNS},
                "ttft_median_ms": _ms(mode.ttft_median_s),
                "ttft_p99_ms": _ms(mode.ttft_p99_s),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def hit_rate_by_mode_figure(frame: pd.DataFrame) -> go.Figure:
    """A bar per mode, the oracle's hit rate (every token truly shared) beside it, and the
    bound under memory's when the run measured it."""
    fig = go.Figure(
        [
            go.Bar(
                x=frame["mode"],
                y=frame["hit_rate"],
                name="hit rate",
                marker={"color": "#4c9be8"},
                hovertemplate="%{x}: %{y:.1%}<extra>hit rate</extra>",
            ),
            go.Scatter(
                x=frame["mode"],
                y=frame["oracle_hit_rate"],
                name="oracle",
                mode="markers+lines",
                marker={"symbol": "line-ew-open", "size": 28, "color": "#d1495b"},
                line={"dash": "dot", "color": "#d1495b"},
                hovertemplate="%{x}: %{y:.1%}<extra>oracle</extra>",
            ),
        ]
    )
    if "bound_hit_rate" in frame and frame["bound_hit_rate"].notna().any():
        fig.add_trace(
            go.Scatter(
                x=frame["mode"],
                y=frame["bound_hit_rate"],
                name="bound under memory",
                mode="markers+lines",
                marker={"symbol": "line-ew-open", "size": 28, "color": "#6a4c93"},
                line={"dash": "dash", "color": "#6a4c93"},
                hovertemplate="%{x}: %{y:.1%}<extra>bound</extra>",
            )
        )
    fig.update_layout(
        height=320,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "mode"}},
        yaxis={"title": {"text": "token hit rate (%)"}, "tickformat": ".0%", "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.15},
    )
    return fig


def ttft_by_mode_figure(frame: pd.DataFrame) -> go.Figure:
    """Median and p99 time to first token per mode, grouped bars in milliseconds."""
    fig = go.Figure(
        [
            go.Bar(
                x=frame["mode"],
                y=frame["ttft_median_ms"],
                name="median",
                marker={"color": "#2a9d5c"},
            ),
            go.Bar(
                x=frame["mode"], y=frame["ttft_p99_ms"], name="p99", marker={"color": "#f0a202"}
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        height=320,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "mode"}},
        yaxis={"title": {"text": "TTFT (ms)"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.15},
    )
    return fig


#: The results table's headers, and how each column is shown: fractions as percentages,
#: throughput in whole tokens a second, times to two decimals.
TABLE = {
    "mode": "mode",
    "num_requests": "requests",
    "hit_rate": "hit rate (%)",
    "oracle_hit_rate": "oracle hit rate (%)",
    "bound_hit_rate": "bound hit rate (%)",
    "computed_tokens": "computed tokens",
    "forward_passes": "forward passes",
    "cow_copies": "copies on write",
    "ttft_median_ms": "TTFT median (ms)",
    "ttft_p99_ms": "TTFT p99 (ms)",
    "throughput_tok_s": "throughput (tokens/s)",
    "wall_s": "wall time (s)",
}


def modes_table(frame: pd.DataFrame) -> pd.DataFrame:
    """`modes_frame` as a person reads it: human headers, percentages, rounded numbers."""
    table = frame.copy()
    for column in ("hit_rate", "oracle_hit_rate", "bound_hit_rate"):
        table[column] = (pd.to_numeric(table[column]) * 100).round(1)
    for column in ("ttft_median_ms", "ttft_p99_ms"):
        table[column] = pd.to_numeric(table[column]).round(2)
    table["throughput_tok_s"] = pd.to_numeric(table["throughput_tok_s"]).round(0).astype("Int64")
    table["wall_s"] = pd.to_numeric(table["wall_s"]).round(3)
    return table[list(TABLE)].rename(columns=TABLE)
