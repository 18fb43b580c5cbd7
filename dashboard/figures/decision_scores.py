"""One routing decision (from `GET /fleet/decisions/{id}`): each engine's score and what it was
made of: the usable hybrid hit, the attention match, the hit a request in flight there will
leave, the gain the policy counted of them (none below the decision's minimum hit), the load
subtracted and the load credited back, so the columns add up to the score."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import Decision
from dashboard.figures.fleet import engine_label

SCORE_COLUMNS = [
    "engine",
    "url",
    "hit",
    "attention",
    "in_flight",
    "gain counted",  # score = gain counted - load + credit
    "load",
    "credit",
    "score",
    "chosen",
]
#: The parts of a score, as the decision chart draws them: (column, legend name, colour).
COMPONENTS = [
    ("hit", "usable hybrid hit", "#2a9d5c"),
    ("attention", "attention match", "#4c9be8"),
    ("in_flight", "hit in flight", "#f0a202"),
]
LOAD_COLOR = "#d1495b"
CHOSEN_COLOR, OTHER_COLOR = "#1b1b1b", "#a8a8a8"


def scores_frame(decision: Decision) -> pd.DataFrame:
    """One row per engine the decision scored, `chosen` marking where the request went."""
    rows = [
        [engine_label(s.engine_id, s.url), s.url, s.hit, s.attention, s.in_flight]
        + [s.gain, s.load, s.credit, s.score, s.url == decision.url]
        for s in decision.scores
    ]
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def scores_figure(frame: pd.DataFrame, reason: str) -> go.Figure:
    """Per engine, the parts of its score (the load below zero: it is subtracted) and the score
    the policy ranked by; the chosen engine's score bar is dark and outlined, and labelled with
    the `reason` it was chosen."""
    fig = go.Figure()
    for column, name, color in COMPONENTS:
        fig.add_trace(_bar(frame, frame[column], name, color))
    fig.add_trace(_bar(frame, -frame["load"], "load (subtracted)", LOAD_COLOR))
    chosen = frame["chosen"].tolist()
    score = _bar(
        frame, frame["score"], "score", [CHOSEN_COLOR if c else OTHER_COLOR for c in chosen]
    )
    score.marker.line = {"color": CHOSEN_COLOR, "width": [3 if c else 0 for c in chosen]}
    fig.add_trace(score)
    for row in frame[frame["chosen"]].itertuples():
        fig.add_annotation(
            x=row.engine,
            y=max(row.score, row.hit, row.attention, row.in_flight, 0),
            text=f"chosen: {reason}",
            showarrow=True,
            arrowhead=2,
            ay=-30,
        )
    fig.update_layout(
        barmode="group",
        height=320,
        margin={"l": 60, "r": 20, "t": 40, "b": 40},
        xaxis={"title": {"text": "engine"}, "type": "category"},
        yaxis={"title": {"text": "tokens"}, "zeroline": True},
        legend={"orientation": "h", "y": 1.18},
    )
    return fig


def _bar(frame: pd.DataFrame, values: pd.Series, name: str, color: str | list[str]) -> go.Bar:
    return go.Bar(
        x=frame["engine"],
        y=values,
        name=name,
        marker={"color": color},
        customdata=frame["url"],
        hovertemplate="%{x} (%{customdata})<br>%{y:,} tokens<extra>" + name + "</extra>",
    )
