"""The blocks a peer engine stored and removed per second, per group, from `GET
.../peer-summary`; and the gaps in that event stream the bridge could not fill (its resyncs)."""

from __future__ import annotations

import msgspec
import pandas as pd
import plotly.graph_objects as go

from client.types import PeerResyncOut, PeerSummary

BUCKET_S = 60  # the store's default churn bucket, when the series is too short to tell


def churn_frame(summary: PeerSummary) -> pd.DataFrame:
    """Blocks stored and removed per second, per bucket and group (every rank and medium)."""
    frame = pd.DataFrame(
        [msgspec.structs.asdict(bucket) for bucket in summary.churn],
        columns=["ts", "rank", "group", "medium", "stored", "removed"],
    )
    if not len(frame):
        return pd.DataFrame(columns=["time", "group", "kind", "per_s"])
    starts = sorted(frame["ts"].unique())
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False) if b > a]
    bucket_s = min(gaps) if gaps else BUCKET_S
    summed = frame.groupby(["ts", "group"], as_index=False)[["stored", "removed"]].sum()
    long = summed.melt(["ts", "group"], ["stored", "removed"], var_name="kind", value_name="n")
    long["time"] = pd.to_datetime(long["ts"], unit="s", utc=True)
    long["per_s"] = long["n"] / bucket_s
    return long[["time", "group", "kind", "per_s"]].sort_values(["group", "kind", "time"])


def churn_figure(frame: pd.DataFrame) -> go.Figure:
    """A line per group and kind: stored solid, removed dashed."""
    fig = go.Figure()
    for (group, kind), part in frame.groupby(["group", "kind"], sort=True):
        fig.add_trace(
            go.Scatter(
                x=part["time"],
                y=part["per_s"],
                mode="lines+markers",
                name=f"{kind} · {group}",
                line={"dash": "solid" if kind == "stored" else "dash"},
                hovertemplate="%{x}<br>%{y:.2f} blocks/s<extra>" + f"{kind} · {group}</extra>",
            )
        )
    fig.update_layout(
        height=260,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "time (UTC)"}, "tickformat": "%H:%M:%S"},
        yaxis={"title": {"text": "blocks/s"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.15},
    )
    return fig


def resync_text(resyncs: list[PeerResyncOut]) -> str | None:
    """A warning's text when the stream had gaps the bridge could not fill; None without."""
    if not resyncs:
        return None
    last = resyncs[-1]
    count = "1 gap" if len(resyncs) == 1 else f"{len(resyncs):,} gaps"
    return (
        f"The engine's event stream had {count} the bridge could not fill in this window, so "
        "the blocks below may include some the engine has since removed, or miss some it "
        f"stored, until they are stored or removed again. Last: rank {last.rank}, batches "
        f"{last.first_missing_seq:,} to {last.resumed_seq:,} ({last.reason})."
    )
