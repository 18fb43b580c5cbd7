"""Where hits come from and what moves between the tiers: hit tokens by tier (device, host
memory, disk, the shared store) and bytes loaded per tier over time (`GET .../hit-rate`), a
request's hit by tier (`GET .../requests`), and the units each tier holds (`.../blocks/tiers`).
Pure functions from API bodies to frames and from frames to Plotly figures."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from client.types import HitRateOut, RequestOut, TierPage
from dashboard.figures.hit_rate import time_axis

TIERS = ("device", "host", "disk", "shared")
TIER_COLORS = {"device": "#4c9be8", "host": "#f0a202", "disk": "#8e6cc2", "shared": "#3aa66a"}
BELOW = TIERS[1:]
MOVES_COLUMNS = ["time", "bucket_s", "tier", "hit_tokens", "loaded_bytes"]


def moves_frame(hit_rate: HitRateOut) -> pd.DataFrame:
    """Long form: per bucket and tier, the hit tokens it served and the bytes read from it
    (the device's: the bucket's hit tokens less the tiers', no bytes)."""
    rows = []
    for bucket in hit_rate.buckets:
        time = pd.Timestamp(bucket.bucket_start, unit="s", tz="UTC")
        below = {t: bucket.hit_tokens_by_tier.get(t, 0) for t in BELOW}
        device = max(0, bucket.cached_tokens - sum(below.values()))
        for tier, tokens in {"device": device, **below}.items():
            moved = bucket.loaded_bytes_by_tier.get(tier, 0)
            rows.append([time, bucket.bucket_s, tier, tokens, moved])
    return pd.DataFrame(rows, columns=MOVES_COLUMNS)


def tier_hits_figure(frame: pd.DataFrame) -> go.Figure:
    """Hit tokens per bucket, stacked by the tier that served them."""
    fig = go.Figure()
    for tier in TIERS:
        part = frame[frame["tier"] == tier]
        if not len(part) or (tier != "device" and not part["hit_tokens"].any()):
            continue
        fig.add_trace(
            go.Bar(
                x=part["time"],
                y=part["hit_tokens"],
                name=tier,
                marker={"color": TIER_COLORS[tier]},
                hovertemplate="%{x|%H:%M:%S} · %{y:,} hit tokens from " + tier + "<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=260,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis=time_axis(frame),
        yaxis={"title": {"text": "hit tokens"}},
        legend={"orientation": "h", "y": 1.2},
    )
    return fig


def bytes_moved_figure(frame: pd.DataFrame) -> go.Figure:
    """Bytes read from each tier below the device per bucket, one line per tier."""
    fig = go.Figure()
    for tier in BELOW:
        part = frame[frame["tier"] == tier]
        if not len(part) or not part["loaded_bytes"].any():
            continue
        fig.add_trace(
            go.Scatter(
                x=part["time"],
                y=part["loaded_bytes"],
                name=tier,
                mode="lines+markers",
                line={"color": TIER_COLORS[tier]},
                hovertemplate="%{x|%H:%M:%S} · %{y:,} bytes loaded from "
                + tier
                + "<extra></extra>",
            )
        )
    fig.update_layout(
        height=220,
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        xaxis=time_axis(frame),
        yaxis={"title": {"text": "bytes loaded"}},
        legend={"orientation": "h", "y": 1.25},
    )
    return fig


def request_tiers(request: RequestOut) -> dict[str, int]:
    """A request's hit by tier, fastest first (the device alone from a store before tiers)."""
    by_tier = request.hit_tokens_by_tier or {"device": request.num_cached_tokens}
    return {tier: by_tier[tier] for tier in TIERS if by_tier.get(tier)}


def request_tiers_text(request: RequestOut) -> str:
    """'hit 512 tokens: 256 from the device, 256 from host (2,072 bytes loaded)'."""
    parts = []
    for tier, tokens in request_tiers(request).items():
        moved = (request.loaded_bytes_by_tier or {}).get(tier)
        parts.append(f"{tokens:,} from {tier}" + (f" ({moved:,} bytes loaded)" if moved else ""))
    if not parts:
        return "No hit: every prompt token was computed."
    return f"Hit {request.num_cached_tokens:,} tokens: " + ", ".join(parts) + "."


def tier_usage_frame(page: TierPage) -> pd.DataFrame:
    """Each tier below the device: units and tokens held, and its capacity."""
    rows = [
        {
            "tier": tier,
            "units": usage.num_units,
            "tokens": usage.num_tokens,
            "capacity (bytes)": usage.capacity_bytes,
        }
        for tier, usage in page.tiers.items()
    ]
    frame = pd.DataFrame(rows, columns=["tier", "units", "tokens", "capacity (bytes)"])
    frame["capacity (bytes)"] = frame["capacity (bytes)"].astype("Int64")
    return frame


def tier_units_frame(page: TierPage) -> pd.DataFrame:
    """The units held, one row each: its tier, token range and key."""
    rows = [
        {
            "tier": unit.tier,
            "tokens": f"[{unit.token_range[0]:,}, {unit.token_range[1]:,})",
            "key": unit.key,
            "parent": unit.parent or "",
        }
        for unit in page.units
    ]
    return pd.DataFrame(rows, columns=["tier", "tokens", "key", "parent"])


def tier_style(frame: pd.DataFrame):
    """The units' table coloured by tier (a pandas Styler for `st.dataframe`)."""

    def color(tier: str) -> str:
        return f"background-color: {TIER_COLORS.get(tier, '#adb5bd')}40"

    return frame.style.map(color, subset=["tier"])
