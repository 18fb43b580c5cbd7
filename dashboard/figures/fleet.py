"""The router's fleet (from `GET /fleet`): each engine's state, load, cached keys, share of the
routed requests and the hit rate it gave them."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.schema import ATTENTION, MAMBA
from client.types import FleetView

ENGINE_COLUMNS = [
    "engine",
    "url",
    "status",
    "why down",  # in full: the status column is sized to its short words
    "routed",
    "routed share",
    "hit rate",
    "in flight",
    "running",
    "waiting",
    "queued prefill tokens",
    "attention usage",
    "mamba usage",
    "attention keys",
    "mamba keys",
    "failed",
    "last frame (s ago)",
]


def engine_label(engine_id: str | None, url: str) -> str:
    """An engine as the page names it: its id, or its URL until its feed said the id."""
    return engine_id or url


def down_reasons(fleet: FleetView) -> list[str]:
    """Each down engine's reason in full, as a line below the table: in a cell, the grid sizes
    the column to its first rows and cut a reason after `up` rows to "down: c"."""
    return [
        f"**{engine_label(e.engine_id, e.url)}** ({e.url}) is down: {e.down_reason}"
        for e in fleet.engines
        if e.status == "down" and e.down_reason
    ]


def engines_frame(fleet: FleetView) -> pd.DataFrame:
    """One row per engine of `GET /fleet`."""
    rows = []
    for e in fleet.engines:
        load = e.load
        rows.append(
            [
                engine_label(e.engine_id, e.url),
                e.url,
                e.status,
                (e.down_reason or "") if e.status == "down" else "",
                e.num_routed,
                e.routed_share,
                e.hit_rate,
                e.num_in_flight,
                load.num_running,
                load.num_waiting,
                load.num_prefill_tokens,
                load.usage[ATTENTION],
                load.usage[MAMBA],
                e.num_keys[ATTENTION],
                e.num_keys[MAMBA],
                e.num_failed,
                e.last_frame_age_s,
            ]
        )
    return pd.DataFrame(rows, columns=ENGINE_COLUMNS)


def share_figure(frame: pd.DataFrame) -> go.Figure:
    """Per engine, its share of the routed requests beside the hit rate it gave them."""
    fig = go.Figure()
    for column, color in (("routed share", "#4c9be8"), ("hit rate", "#2a9d5c")):
        fig.add_trace(
            go.Bar(
                x=frame["engine"],
                y=frame[column],
                name=column,
                marker={"color": color},
                hovertemplate="%{x}<br>%{y:.1%}<extra>" + column + "</extra>",
            )
        )
    fig.update_layout(
        barmode="group",
        height=280,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "engine"}, "type": "category"},
        yaxis={"tickformat": ".0%", "range": [0, 1.05]},
        legend={"orientation": "h", "y": 1.15},
    )
    return fig
