"""Miss attribution: why the tokens a request truly shared with earlier requests (the online
oracle) missed the cache, split by reason, and the remedy for each reason with what it would
have saved. From `GET /engines/{id}/attribution` (buckets) and each request's `attribution`.

hit + sum(missed by reason) = shared tokens, per request and per bucket.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.hit_rate import time_axis


class Series(NamedTuple):
    """How one series of the attribution reads and looks."""

    label: str  # its name in legends and tables
    color: str  # never red: no reason is an error
    short: str  # a few words, beside the label in the legend
    meaning: str  # one sentence, in tooltips and the reasons' table


HIT = Series("hit", "#2a9d5c", "served from the cache", "Tokens the cache served.")
SHARED = Series(
    "shared (oracle)",
    "#1b1b1b",
    "what was truly shared",
    "The longest prefix each request shared with an earlier request in the retention window "
    "or a pin: what a cache that kept everything could have hit (hit + missed).",
)
#: Why shared tokens missed, in stacking order (`attribution.missed_tokens`' keys).
REASONS: dict[str, Series] = {
    "no_state": Series(
        "no state",
        "#8e6cc4",
        "no Mamba state at the match",
        "The recurrent (Mamba) state was missing at or below the attention match: a junction "
        "checkpoint or a pin there would have kept it.",
    ),
    "in_flight": Series(
        "in flight",
        "#f0a202",
        "being computed by another request",
        "Another request in flight was computing those blocks and had not registered them yet.",
    ),
    "held_back": Series(
        "held back",
        "#3aa6a6",
        "one unit held back (resend, EAGLE)",
        "The hit was held one match unit back: an exact resend recomputes its last unit for "
        "the next token's logits, and EAGLE drafts need the last unit's hidden states.",
    ),
    "evicted": Series(
        "evicted",
        "#a67c52",
        "removed before the request came",
        "The prefix had been cached and was evicted before this request came.",
    ),
    "copy_pending": Series(
        "copy pending",
        "#9aa5b1",
        "waited for a copy (0 tokens)",
        "A checkpoint's copy was pending: the engine waits a step for it instead of missing, "
        "so this counts steps, never tokens.",
    ),
}
#: Why a request's hit stopped where it did (`attribution.stop_reason`), in plain words.
STOP_REASONS = {
    "attention_ended": "the attention match ended: nothing more was cached",
    "no_state": "no Mamba state was kept at the attention match",
    "in_flight": "a request in flight was still computing the rest",
    "held_back": "the hit was held one match unit back (resend or EAGLE)",
}
STOP_LABELS = {
    "attention_ended": "match ended",
    "no_state": "no state",
    "in_flight": "in flight",
    "held_back": "held back",
}
BUCKET_COLUMNS = ["prompt_tokens", "hit_tokens", "shared_tokens", "oracle_tokens"]


# ------------------------------------------------------------------ over time
def attribution_frame(attribution: dict) -> pd.DataFrame:
    """One row per bucket the API returned (a bucket without requests has none), oldest
    first: `time`, `bucket_s`, the token counts and the missed tokens in a column per reason."""
    rows = [
        {
            "time": pd.Timestamp(bucket["bucket_start"], unit="s", tz="UTC"),
            "bucket_s": bucket["bucket_s"],
            **{name: bucket[name] for name in BUCKET_COLUMNS},
            **{reason: bucket["missed_tokens"].get(reason, 0) for reason in REASONS},
        }
        for bucket in attribution["buckets"]
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


# ------------------------------------------------------------------ per request
def is_attributed(request: dict) -> bool:
    attribution = request.get("attribution")
    return bool(attribution) and attribution.get("state") == "attributed"


def attribution_status(request: dict) -> str:
    """`attributed`, `pending` (an earlier request is still in flight), or `not recorded`
    (stored before the control plane attributed misses)."""
    attribution = request.get("attribution")
    return attribution["state"] if attribution else "not recorded"


def missed_text(missed: dict[str, int]) -> str:
    """`"32 no state · 16 held back"`, the reasons that missed tokens; `"none"` if none did."""
    parts = [f"{missed[r]:,} {s.label}" for r, s in REASONS.items() if missed.get(r)]
    return " · ".join(parts) or "none"


def request_columns(request: dict) -> dict:
    """A request's attribution as table columns: the tokens it shared and missed (None until
    it has an attribution), the missed tokens by reason (or why there are none yet) and why
    its hit stopped."""
    status = attribution_status(request)
    if not is_attributed(request):
        return {"shared": None, "missed": None, "missed because": status, "hit stopped": None}
    attribution = request["attribution"]
    missed = attribution["missed_tokens"]
    return {
        "shared": attribution["shared_tokens"],
        "missed": sum(missed.values()),
        "missed because": missed_text(missed),
        "hit stopped": STOP_LABELS.get(attribution["stop_reason"], attribution["stop_reason"]),
    }


def attribution_sentence(request: dict) -> str:
    """What a request shared, hit and missed, and why its hit stopped, in plain words."""
    status = attribution_status(request)
    if status == "pending":
        return (
            "Miss attribution **pending**: the control plane attributes a request once every "
            "request that arrived before it has finished."
        )
    if status != "attributed":
        return "No miss attribution: this request was stored before the control plane kept one."
    attribution = request["attribution"]
    missed = attribution["missed_tokens"]
    shared = attribution["shared_tokens"]
    text = (
        f"Shared **{shared:,}** tokens with earlier requests or pins; hit "
        f"**{request['num_cached_tokens']:,}**, missed **{sum(missed.values()):,}**"
        + (f" ({missed_text(missed)})" if sum(missed.values()) else "")
        + f". The hit stopped because {STOP_REASONS.get(attribution['stop_reason'], '?')}."
    )
    steps = attribution.get("copy_wait_steps", 0)
    if steps:
        text += f" It waited {steps:,} steps for a checkpoint's copy instead of missing it."
    return text


def requests_attribution_figure(requests: list[dict]) -> go.Figure:
    """A bar per attributed request (newest on top): its hit, then what it missed by reason,
    stacked up to the tokens it truly shared (a diamond)."""
    shown = [r for r in requests if is_attributed(r)][::-1]
    ids = [r["request_id"] for r in shown]
    fig = go.Figure()
    parts = [("hit", HIT, [r["num_cached_tokens"] for r in shown])]
    for reason, series in REASONS.items():
        parts.append(
            (reason, series, [r["attribution"]["missed_tokens"].get(reason, 0) for r in shown])
        )
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
            x=[r["attribution"]["shared_tokens"] for r in shown],
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
