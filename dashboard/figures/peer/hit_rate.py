"""The token hit rate a peer engine's scraped counters give, per rank, between consecutive
scrapes (`GET .../peer-summary`'s metric samples)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import PeerSummary


def peer_hit_rate_frame(summary: PeerSummary) -> pd.DataFrame:
    """Per rank, the hit rate between consecutive scrapes: the hits the counters added over
    the queries they added (a counter that went down, a restarted peer, counts from zero)."""
    rows, last = [], {}
    for sample in summary.metrics:
        rank, now = sample.rank, (sample.queries_tokens, sample.hits_tokens)
        before = last.get(rank)
        last[rank] = now
        if before is None:
            continue
        is_reset = now[0] < before[0] or now[1] < before[1]
        queries, hits = now if is_reset else (now[0] - before[0], now[1] - before[1])
        if queries > 0:
            rows.append(
                {
                    "time": pd.Timestamp(sample.ts, unit="s", tz="UTC"),
                    "rank": rank,
                    "hit_rate": hits / queries,
                    "queries_tokens": queries,
                    "usage": sample.usage,
                }
            )
    return pd.DataFrame(rows, columns=["time", "rank", "hit_rate", "queries_tokens", "usage"])


def peer_hit_rate_figure(frame: pd.DataFrame) -> go.Figure:
    """A line per rank; y in percent of the tokens queried between scrapes."""
    fig = go.Figure()
    for rank, part in frame.groupby("rank", sort=True):
        fig.add_trace(
            go.Scatter(
                x=part["time"],
                y=part["hit_rate"],
                mode="lines+markers",
                name=f"rank {rank}",
                customdata=part["queries_tokens"],
                hovertemplate=(
                    "%{x}<br>%{y:.1%} of %{customdata:,.0f} tokens queried<extra>rank "
                    + str(rank)
                    + "</extra>"
                ),
            )
        )
    fig.update_layout(
        height=260,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "time (UTC, scrape)"}, "tickformat": "%H:%M:%S"},
        yaxis={"title": {"text": "token hit rate (%)"}, "tickformat": ".0%", "range": [0, 1.05]},
        legend={"orientation": "h", "y": 1.15},
    )
    return fig
