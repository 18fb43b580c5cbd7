"""A what-if report (`GET /whatif/{id}`'s `result`, read as `client.types.WhatIfReport`): the
settings tried as a table ranked by tokens saved, hit rate against memory for the settings that
vary it (the curve), hit rate against a tier's size for the settings that vary host memory or
disk (the curve per tier, with the hits each tier served), and the agreement of the replay of
what ran with what the engine recorded."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

from client.types import SettingOutcome, WhatIfReport

AS_RAN = "as ran"
MEMORY_FIELDS = ("num_blocks", "num_mamba_blocks")
#: the tiers below the device a setting may size, by the field that sizes each
TIER_FIELDS = {"host": "host_cache_bytes", "disk": "disk_cache_bytes"}
COLUMNS = [
    "setting",
    "family",
    "memory",
    "num_blocks",
    "num_mamba_blocks",
    "hit_tokens",
    "hit_rate",
    "share_of_oracle",
    "share_of_bound",
    "gain_tokens",
    "is_as_ran",
    "device_hit_tokens",
    "host_hit_tokens",
    "disk_hit_tokens",
    "host_cache_bytes",
    "disk_cache_bytes",
    "tier_family",
]
PALETTE = ("#4c9be8", "#d1495b", "#6a4c93", "#edae49", "#00798c", "#30638e", "#8d6a9f")


def results_frame(report: WhatIfReport) -> pd.DataFrame:
    """One row per setting, what ran first: its hit tokens and rates, its gain over what ran,
    its memory (`memory`: the attention pool's size over what ran, else the Mamba pool's) and
    its `family` (what it changes besides memory: settings of one family differ only there)."""
    as_ran = report.as_ran
    if as_ran is None:
        return pd.DataFrame(columns=COLUMNS)
    rows = [_row(as_ran, as_ran, 0, is_as_ran=True)]
    rows += [_row(r, as_ran, r.gain_tokens) for r in report.results]
    return pd.DataFrame(rows, columns=COLUMNS)


def _row(result: SettingOutcome, ran: SettingOutcome, gain: int, is_as_ran: bool = False) -> dict:
    changes = {k: v for k, v in result.changes.items() if k not in MEMORY_FIELDS}
    family = ", ".join(f"{k} {v}" for k, v in sorted(changes.items())) or AS_RAN
    # what it changes besides the tiers' sizes: settings of one tier family differ only there
    others = {
        k: v for k, v in result.changes.items() if k not in TIER_FIELDS.values() and k != "label"
    }
    tier_family = ", ".join(f"{k} {v}" for k, v in sorted(others.items())) or "device as ran"
    tiers = result.host_hit_tokens + result.disk_hit_tokens
    return {
        "setting": AS_RAN if is_as_ran else result.label or family,
        "family": family,
        "memory": _memory(result, ran),
        "num_blocks": result.pool("num_blocks"),
        "num_mamba_blocks": result.pool("num_mamba_blocks"),
        "hit_tokens": result.hit_tokens,
        "hit_rate": result.hit_rate,
        "share_of_oracle": result.share_of_oracle,
        "share_of_bound": result.share_of_bound,
        "gain_tokens": gain,
        "is_as_ran": is_as_ran,
        "device_hit_tokens": result.hit_tokens - tiers,
        "host_hit_tokens": result.host_hit_tokens,
        "disk_hit_tokens": result.disk_hit_tokens,
        "host_cache_bytes": result.tier_bytes("host_cache_bytes"),
        "disk_cache_bytes": result.tier_bytes("disk_cache_bytes"),
        "tier_family": tier_family,
    }


def _memory(result: SettingOutcome, ran: SettingOutcome) -> float:
    """The setting's memory over what ran: the attention pool's ratio, else the Mamba one's."""
    ratios = [
        result.pool(name) / ran.pool(name)
        for name in MEMORY_FIELDS
        if result.pool(name) and ran.pool(name)
    ]
    moved = [ratio for ratio in ratios if abs(ratio - 1.0) > 1e-9]
    return moved[0] if moved else 1.0


def curve_families(frame: pd.DataFrame) -> list[str]:
    """The families tried at more than one memory (what ran counts in its own family)."""
    if frame.empty:
        return []
    sizes = frame.groupby("family", sort=False)["memory"].nunique()
    return [family for family, n in sizes.items() if n > 1]


def curve_figure(frame: pd.DataFrame) -> go.Figure:
    """Hit rate against memory (× what ran, log scale), a line per family tried at more than
    one memory; what ran is the starred point."""
    fig = go.Figure()
    for index, family in enumerate(curve_families(frame)):
        points = frame[frame["family"] == family].sort_values("memory")
        color = PALETTE[index % len(PALETTE)]
        fig.add_trace(
            go.Scatter(
                x=points["memory"],
                y=points["hit_rate"],
                name=family,
                mode="lines+markers",
                line={"color": color},
                marker={"size": 9, "color": color},
                customdata=points[["setting", "hit_tokens"]].to_numpy(),
                hovertemplate="%{customdata[0]}<br>memory ×%{x:.2g}: %{y:.1%} "
                "(%{customdata[1]:,} tokens)<extra></extra>",
            )
        )
    ran = frame[frame["is_as_ran"]]
    if not ran.empty:
        fig.add_trace(
            go.Scatter(
                x=ran["memory"],
                y=ran["hit_rate"],
                name="what ran",
                mode="markers",
                marker={"symbol": "star", "size": 16, "color": "#222222"},
                hovertemplate="what ran: %{y:.1%}<extra></extra>",
            )
        )
    fig.update_layout(
        height=360,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        xaxis={"title": "memory (× what ran)", "type": "log"},
        yaxis={"title": "token hit rate", "tickformat": ".0%", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def has_tiers(frame: pd.DataFrame) -> bool:
    """Some setting tried a tier below the device, or some hit came from one."""
    if frame.empty:
        return False
    columns = ["host_hit_tokens", "disk_hit_tokens", "host_cache_bytes", "disk_cache_bytes"]
    return bool((frame[columns] > 0).to_numpy().any())


def tier_curves(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """For each tier, the settings that vary its size alone (the other tier and the rest
    fixed), what ran among them at size 0 when they change nothing else: the points of that
    tier's curve, smallest first. A tier with fewer than two sizes has none."""
    curves = {}
    for tier, field in TIER_FIELDS.items():
        other = TIER_FIELDS["disk" if tier == "host" else "host"]
        best: pd.DataFrame | None = None
        for _, group in frame.groupby(["tier_family", other], sort=False):
            if group[field].nunique() > 1 and (best is None or len(group) > len(best)):
                best = group
        if best is not None:
            curves[tier] = best.sort_values(field).drop_duplicates(field)
    return curves


def tier_curve_figure(frame: pd.DataFrame) -> go.Figure:
    """Hit rate against a tier's size (GiB, log scale once past 0): "what would 64 GB of host
    memory buy". A line per tier for the whole hit rate, dotted for the share that tier
    served."""
    fig = go.Figure()
    for index, (tier, points) in enumerate(tier_curves(frame).items()):
        field, color = TIER_FIELDS[tier], PALETTE[index % len(PALETTE)]
        size = points[field] / 2**30
        prompt = points["hit_tokens"] / points["hit_rate"].where(points["hit_rate"] > 0)
        for y, name, dash in (
            (points["hit_rate"], f"{tier}: hit rate", "solid"),
            (points[f"{tier}_hit_tokens"] / prompt, f"{tier}: served by {tier}", "dot"),
        ):
            fig.add_trace(
                go.Scatter(
                    x=size, y=y.fillna(0.0), name=name, mode="lines+markers",
                    line={"color": color, "dash": dash}, marker={"size": 8, "color": color},
                    customdata=points[["setting"]].to_numpy(),
                    hovertemplate="%{customdata[0]}<br>%{x:.3g} GiB: %{y:.1%}<extra></extra>",
                )
            )  # fmt: skip
    fig.update_layout(
        height=360,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        xaxis={"title": "tier size (GiB)"},
        yaxis={"title": "token hit rate", "tickformat": ".0%", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def tier_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Each setting's hit tokens by where they came from: the device, host memory, disk."""
    ranked = frame.sort_values(["gain_tokens", "is_as_ran"], ascending=[False, False])
    return pd.DataFrame(
        {
            "setting": ranked["setting"],
            "host GiB": ranked["host_cache_bytes"] / 2**30,
            "disk GiB": ranked["disk_cache_bytes"] / 2**30,
            "from device": ranked["device_hit_tokens"],
            "from host": ranked["host_hit_tokens"],
            "from disk": ranked["disk_hit_tokens"],
            "hit rate": ranked["hit_rate"] * 100,
        }
    ).reset_index(drop=True)


def ranked_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The settings tried, most tokens saved first (what ran among them, at a gain of 0)."""
    if frame.empty:
        return pd.DataFrame(
            columns=["setting", "hit tokens", "% of oracle", "% of bound", "gain vs as ran"]
        )
    ranked = frame.sort_values(["gain_tokens", "is_as_ran"], ascending=[False, False])
    return pd.DataFrame(
        {
            "setting": ranked["setting"],
            "hit tokens": ranked["hit_tokens"],
            "hit rate": ranked["hit_rate"] * 100,
            "% of oracle": ranked["share_of_oracle"] * 100,
            "% of bound": ranked["share_of_bound"] * 100,
            "gain vs as ran": ranked["gain_tokens"],
        }
    ).reset_index(drop=True)


def agreement_text(report: WhatIfReport) -> str:
    """The line that says how far the replay of what ran is to be trusted."""
    agreement, total = report.agreement, report.num_requests
    recorded = report.recorded_tokens
    replayed = report.as_ran.hit_tokens if report.as_ran is not None else 0
    text = (
        f"Replaying its own settings reproduces {agreement:,} of {total:,} requests' hits "
        f"({replayed:,} hit tokens replayed, {recorded:,} recorded)"
    )
    return text + (": exact." if report.exact else ".")


def settings_text(settings: list[dict]) -> str:
    """A run's settings in one line, as its table row shows them."""
    return "; ".join(s.get("label") or json.dumps(s, sort_keys=True) for s in settings)
