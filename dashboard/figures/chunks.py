"""One request's prefill as a timeline: the cached prefix it hit, then each chunk it computed
as a bar over its token positions, coloured by the reason the chunk stopped there."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import RequestOut

#: The scheduler's stop reasons (`chunk_stop_reasons`), and the hit drawn before the chunks.
REASON_COLORS = {
    "cached (hit)": "#9aa5b1",
    "block_boundary": "#4c9be8",
    "resend": "#f0a202",
    "extension": "#e36414",
    "junction": "#d1495b",
    "message": "#8338ec",
    "pin": "#2a9d5c",
    "budget": "#6f2dbd",
    "end": "#1b1b1b",
}
COLUMNS = ["label", "start", "end", "tokens", "reason"]


def chunk_frame(request: RequestOut) -> pd.DataFrame:
    """The hit `[0, num_cached_tokens)` (when there is one), then one row per chunk."""
    rows = []
    hit = request.num_cached_tokens
    if hit:
        rows.append({"label": "hit", "start": 0, "end": hit, "reason": "cached (hit)"})
    reasons = request.chunk_stop_reasons
    for i, (start, end) in enumerate(request.chunks):
        reason = reasons[i] if i < len(reasons) else "end"
        rows.append({"label": f"chunk {i + 1}", "start": start, "end": end, "reason": reason})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["tokens"] = frame["end"] - frame["start"]
    return frame


def chunk_timeline_figure(frame: pd.DataFrame, title: str = "") -> go.Figure:
    """A bar per row from `start` to `end` tokens, one trace (legend entry) per reason."""
    fig = go.Figure()
    for reason, part in frame.groupby("reason", sort=False):
        fig.add_trace(
            go.Bar(
                y=part["label"],
                x=part["tokens"],
                base=part["start"],
                orientation="h",
                name=str(reason),
                marker={"color": REASON_COLORS.get(str(reason), "#888")},
                customdata=part[["start", "end"]].to_numpy(),
                hovertemplate="%{y}: tokens [%{customdata[0]}, %{customdata[1]})<br>stopped: "
                + str(reason)
                + "<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        height=140 + 34 * len(frame),
        margin={"l": 80, "r": 20, "t": 40 if title else 10, "b": 40},
        xaxis={"title": {"text": "prompt position (tokens)"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "categoryorder": "array", "categoryarray": frame["label"]},
        legend={"orientation": "h", "y": -0.25, "title": {"text": "stopped at"}},
    )
    return fig
