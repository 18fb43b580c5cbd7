"""The tiers in the dashboard's figures (issue 49): hit tokens by tier over time add up to the
bucket's hit, bytes loaded per tier, a request's hit by tier, and the units' table coloured by
tier."""

from __future__ import annotations

from client.types import HitRateOut, RequestOut, TierPage
from dashboard.figures.tiers import (
    TIER_COLORS,
    bytes_moved_figure,
    moves_frame,
    request_tiers_text,
    tier_hits_figure,
    tier_style,
    tier_units_frame,
    tier_usage_frame,
)
from tests.dashboard.bodies import body

BUCKETS = [
    {
        "bucket_start": 60,
        "bucket_s": 60,
        "cached_tokens": 900,
        "hit_tokens_by_tier": {"host": 300, "disk": 100},
        "loaded_bytes_by_tier": {"host": 3000, "disk": 1000},
    },
    {"bucket_start": 120, "bucket_s": 60, "cached_tokens": 200},
]


def test_hit_tokens_by_tier_add_up_to_each_buckets_hit():
    frame = moves_frame(body(HitRateOut, {"buckets": BUCKETS}))
    for bucket in BUCKETS:
        rows = frame[frame["time"].map(lambda t: t.timestamp()) == bucket["bucket_start"]]
        assert rows["hit_tokens"].sum() == bucket["cached_tokens"]
    first = frame[frame["time"].map(lambda t: t.timestamp()) == 60].set_index("tier")
    assert first.loc["device", "hit_tokens"] == 500 and first.loc["host", "loaded_bytes"] == 3000
    hits = tier_hits_figure(frame)
    assert [t.name for t in hits.data] == ["device", "host", "disk"]  # no shared store: no bar
    assert [t.marker.color for t in hits.data] == [
        TIER_COLORS[t] for t in ("device", "host", "disk")
    ]
    moved = bytes_moved_figure(frame)
    assert [(t.name, list(t.y)) for t in moved.data] == [("host", [3000, 0]), ("disk", [1000, 0])]


def test_a_request_says_its_hit_by_tier():
    request = body(
        RequestOut,
        {
            "num_cached_tokens": 512,
            "hit_tokens_by_tier": {"device": 256, "disk": 256},
            "loaded_bytes_by_tier": {"disk": 4096},
        },
    )
    assert request_tiers_text(request) == (
        "Hit 512 tokens: 256 from device, 256 from disk (4,096 bytes loaded)."
    )
    old = body(RequestOut, {"num_cached_tokens": 64})  # a store before tiers: the device's
    assert request_tiers_text(old) == "Hit 64 tokens: 64 from device."


def test_the_units_table_is_coloured_by_tier():
    page = body(
        TierPage,
        {
            "tiers": {
                "host": {"num_units": 1, "num_tokens": 64, "capacity_bytes": 4096},
                "disk": {"num_units": 1, "num_tokens": 128, "capacity_bytes": None},
            },
            "units": [
                {"tier": "host", "key": "aa", "parent": None, "token_range": [0, 64]},
                {"tier": "disk", "key": "bb", "parent": "aa", "token_range": [64, 192]},
            ],
        },
    )
    usage = tier_usage_frame(page)
    assert list(usage["tier"]) == ["host", "disk"] and list(usage["tokens"]) == [64, 128]
    units = tier_units_frame(page)
    assert list(units["tokens"]) == ["[0, 64)", "[64, 192)"]
    html = tier_style(units).to_html()
    assert TIER_COLORS["host"] in html and TIER_COLORS["disk"] in html
