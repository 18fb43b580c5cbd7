"""A vLLM or SGLang engine's cache, drawn: its cached prefix tree (`GET .../peer-tree`), with
the Mamba states and the suggested junctions on it; and from `GET .../peer-summary`, the blocks
each tier holds per group, blocks stored and removed per second, and the token hit rate its
scraped counters give. Pure functions of the REST bodies."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

MEDIUM_COLORS = {"GPU": "#4c9be8", "CPU": "#f0a202", "STORAGE": "#8e6cc2"}
STATE_COLOR = "#2a9d5c"
JUNCTION_COLOR = "#d62828"
TREE_COLUMNS = [
    "node_id",
    "parent_id",
    "start",
    "end",
    "lane",
    "num_blocks",
    "num_leaves",
    "num_hidden_children",
    "states",
    "mediums",
    "first_tokens",
]
BUCKET_S = 60  # the store's default churn bucket, when the series is too short to tell


def tree_frame(tree: dict) -> pd.DataFrame:
    """One row per node, laid out as a tree along the token axis: a node's `lane` (its row)
    is its first child's, so a prefix and its longest-listed extension read as one line, and
    each further child opens a lane below."""
    nodes = sorted(tree["nodes"], key=lambda n: n["node_id"])
    kids: dict[int | None, list[dict]] = {}
    for node in nodes:
        kids.setdefault(node["parent_id"], []).append(node)
    lanes: dict[int, int] = {}
    next_lane = 0
    stack = [(node, None) for node in reversed(kids.get(None, []))]
    while stack:  # depth first; a first child inherits its parent's lane
        node, lane = stack.pop()
        if lane is None:
            lane, next_lane = next_lane, next_lane + 1
        lanes[node["node_id"]] = lane
        children = kids.get(node["node_id"], [])
        stack += [(child, None) for child in reversed(children[1:])]
        if children:
            stack.append((children[0], lane))
    rows = [
        {**{c: node.get(c) for c in TREE_COLUMNS}, "lane": lanes[node["node_id"]]} for node in nodes
    ]
    return pd.DataFrame(rows, columns=TREE_COLUMNS)


def prefix_tree_figure(frame: pd.DataFrame, junctions: list[dict] | None = None) -> go.Figure:
    """Each node a bar from its start to its end position (tokens), its children joined to
    its end; Mamba states as green diamonds, suggested junctions as red crosses."""
    by_id = frame.set_index("node_id")
    bars_x: list[float | None] = []
    bars_y: list[float | None] = []
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for row in frame.itertuples():
        bars_x += [row.start, row.end, None]
        bars_y += [row.lane, row.lane, None]
        if row.parent_id is not None and row.parent_id in by_id.index:
            parent = by_id.loc[row.parent_id]
            links_x += [parent["end"], row.start, None]
            links_y += [parent["lane"], row.lane, None]
    fig = go.Figure()
    fig.add_trace(_lines(links_x, links_y, "#adb5bd", 1.5, "branch"))
    fig.add_trace(_lines(bars_x, bars_y, "#4c9be8", 9, "cached prefix"))
    fig.add_trace(
        go.Scatter(
            x=(frame["start"] + frame["end"]) / 2,
            y=frame["lane"],
            mode="markers",
            marker={"size": 14, "opacity": 0},
            showlegend=False,
            customdata=frame[["start", "end", "num_blocks", "num_leaves", "num_hidden_children"]],
            text=frame["mediums"].map(lambda m: ", ".join(m or ())),
            hovertemplate=(
                "tokens %{customdata[0]:,}-%{customdata[1]:,}<br>%{customdata[2]:,} blocks · "
                "%{customdata[3]:,} cached prefixes below<br>%{customdata[4]} more branches "
                "not drawn<br>held in %{text}<extra></extra>"
            ),
        )
    )
    states = [(p, row.lane) for row in frame.itertuples() for p in (row.states or ())]
    fig.add_trace(
        go.Scatter(
            x=[p for p, _ in states],
            y=[lane for _, lane in states],
            mode="markers",
            name="Mamba state",
            marker={"symbol": "diamond", "size": 11, "color": STATE_COLOR},
            hovertemplate="Mamba state at %{x:,}<extra></extra>",
        )
    )
    lane_at = {int(row.end): int(row.lane) for row in frame.itertuples()}
    shown = [j for j in junctions or [] if j["position"] in lane_at]
    fig.add_trace(
        go.Scatter(
            x=[j["position"] for j in shown],
            y=[lane_at[j["position"]] for j in shown],
            mode="markers",
            name="suggested junction",
            marker={"symbol": "x", "size": 13, "color": JUNCTION_COLOR},
            customdata=[[j["num_prefixes"], j["tokens_saved"]] for j in shown],
            hovertemplate=(
                "junction at %{x:,}: %{customdata[0]} prefixes part here, a state would save "
                "%{customdata[1]:,} tokens each<extra></extra>"
            ),
        )
    )
    num_lanes = int(frame["lane"].max()) + 1 if len(frame) else 1
    fig.update_layout(
        height=min(900, 160 + 26 * num_lanes),
        margin={"l": 40, "r": 20, "t": 50, "b": 40},
        xaxis={"title": {"text": "position (tokens)"}, "rangemode": "tozero"},
        yaxis={"visible": False, "autorange": "reversed"},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
    )
    return fig


def _lines(x: list, y: list, color: str, width: float, name: str) -> go.Scatter:
    return go.Scatter(
        x=x, y=y, mode="lines", name=name, line={"color": color, "width": width}, hoverinfo="skip"
    )


def tiers_frame(summary: dict) -> pd.DataFrame:
    """Blocks per group and medium."""
    rows = [
        {"group": group, "medium": medium, "blocks": count}
        for group, media in summary["groups"].items()
        for medium, count in media.items()
    ]
    return pd.DataFrame(rows, columns=["group", "medium", "blocks"])


def tiers_figure(frame: pd.DataFrame) -> go.Figure:
    """A horizontal bar per group, stacked by the medium holding its blocks."""
    fig = go.Figure()
    for medium in dict.fromkeys(frame["medium"]):
        part = frame[frame["medium"] == medium]
        fig.add_trace(
            go.Bar(
                y=part["group"],
                x=part["blocks"],
                name=str(medium),
                orientation="h",
                marker={"color": MEDIUM_COLORS.get(str(medium), "#adb5bd")},
                hovertemplate="%{y} · %{x:,} blocks in " + str(medium) + "<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=max(160, 70 + 40 * frame["group"].nunique()),
        margin={"l": 110, "r": 20, "t": 30, "b": 40},
        xaxis={"title": {"text": "blocks"}},
        legend={"orientation": "h", "y": 1.2},
    )
    return fig


def churn_frame(summary: dict) -> pd.DataFrame:
    """Blocks stored and removed per second, per bucket and group (every rank and medium)."""
    frame = pd.DataFrame(
        summary["churn"], columns=["ts", "rank", "group", "medium", "stored", "removed"]
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


def peer_hit_rate_frame(summary: dict) -> pd.DataFrame:
    """Per rank, the hit rate between consecutive scrapes: the hits the counters added over
    the queries they added (a counter that went down, a restarted peer, counts from zero)."""
    rows, last = [], {}
    for sample in summary["metrics"]:
        rank, now = sample["rank"], (sample["queries_tokens"], sample["hits_tokens"])
        before = last.get(rank)
        last[rank] = now
        if before is None:
            continue
        is_reset = now[0] < before[0] or now[1] < before[1]
        queries, hits = now if is_reset else (now[0] - before[0], now[1] - before[1])
        if queries > 0:
            rows.append(
                {
                    "time": pd.Timestamp(sample["ts"], unit="s", tz="UTC"),
                    "rank": rank,
                    "hit_rate": hits / queries,
                    "queries_tokens": queries,
                    "usage": sample.get("usage"),
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


def resync_text(resyncs: list[dict]) -> str | None:
    """A warning's text when the stream had gaps the bridge could not fill; None without."""
    if not resyncs:
        return None
    last = resyncs[-1]
    count = "1 gap" if len(resyncs) == 1 else f"{len(resyncs):,} gaps"
    return (
        f"The engine's event stream had {count} the bridge could not fill in this window, so "
        "the blocks below may include some the engine has since removed, or miss some it "
        f"stored, until they are stored or removed again. Last: rank {last['rank']}, batches "
        f"{last['first_missing_seq']:,} to {last['resumed_seq']:,} ({last['reason']})."
    )
