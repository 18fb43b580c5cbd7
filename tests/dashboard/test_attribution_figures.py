"""Miss attribution's figure builders and remedies, on JSON in the API's shape."""

from __future__ import annotations

import colorsys

import pandas as pd
import pytest

from client.schema import CacheGeometry
from client.types import AttributionOut, GroupUsage, JunctionOut, RequestOut
from dashboard.figures.attribution import attribution_figure, attribution_frame
from dashboard.figures.attribution_bars import requests_attribution_figure
from dashboard.figures.reasons import HIT, REASONS, SHARED
from dashboard.figures.remedies import CHECKPOINTS_PAGE, remedies
from dashboard.figures.request_attribution import attribution_sentence, request_columns
from tests.dashboard.bodies import body


def missed(**tokens: int) -> dict[str, int]:
    return {reason: tokens.get(reason, 0) for reason in REASONS}


def bucket(start: int, hit: int, **reasons: int) -> dict:
    shared = hit + sum(reasons.values())
    return {
        "bucket_start": start,
        "bucket_s": 60,
        "prompt_tokens": shared + 100,
        "hit_tokens": hit,
        "shared_tokens": shared,
        "oracle_tokens": shared - reasons.get("held_back", 0),
        "missed_tokens": missed(**reasons),
    }


ATTRIBUTION = {
    "engine_id": "e",
    "num_pending": 2,
    "total": {},  # the pages read it; the frame reads the buckets
    "buckets": [
        bucket(1_796_124_300, 500, no_state=32, evicted=100),
        # 1_796_124_360 had no request: the API leaves it out
        bucket(1_796_124_420, 200, in_flight=64, held_back=16),
    ],
}


def request(state: str | None = "attributed", **reasons: int) -> dict:
    row = {
        "request_id": "r1",
        "num_prompt_tokens": 400,
        "num_cached_tokens": 256,
        "hit_tokens_by_group": {"attention": 288, "mamba": 256},
    }
    if state is not None:
        row["attribution"] = {
            "state": state,
            "shared_tokens": 256 + sum(reasons.values()),
            "oracle_tokens": 256 + sum(reasons.values()),
            "missed_tokens": missed(**reasons),
            "stop_reason": "no_state" if reasons.get("no_state") else "attention_ended",
            "copy_wait_steps": 0,
        }
    return row


def typed(row: dict) -> RequestOut:
    """A request row as `GET /engines/{id}/requests` answers it."""
    return body(RequestOut, row)


def usage(cache: dict[str, dict]) -> dict[str, GroupUsage]:
    """An engine's `cache` (its usage per group) as `GET /engines/{id}` answers it."""
    return {group: body(GroupUsage, counts) for group, counts in cache.items()}


def test_the_frame_has_a_row_per_bucket_and_a_column_per_reason():
    frame = attribution_frame(body(AttributionOut, ATTRIBUTION))
    assert list(frame["time"]) == [
        pd.Timestamp(t, unit="s", tz="UTC") for t in (1_796_124_300, 1_796_124_420)
    ]
    assert list(frame["no_state"]) == [32, 0]
    assert list(frame["in_flight"]) == [0, 64]
    assert list(frame["shared_tokens"]) == [632, 280]
    assert attribution_frame(body(AttributionOut, {"buckets": []})).empty


def test_buckets_hold_flat_and_a_gap_without_requests_drops_to_zero():
    (shared,) = [
        t
        for t in attribution_figure(attribution_frame(body(AttributionOut, ATTRIBUTION))).data
        if t.name.startswith(SHARED.label)
    ]
    at = [pd.Timestamp(1_796_124_300 + s, unit="s", tz="UTC") for s in (0, 60, 120, 120, 180)]
    assert list(shared.x) == [at[0], at[1], at[1], at[2], at[3], at[4]]
    assert list(shared.y) == [632, 632, 0, 0, 280, 280]


def test_the_stack_of_hit_and_reasons_reaches_the_shared_line():
    fig = attribution_figure(attribution_frame(body(AttributionOut, ATTRIBUTION)))
    stacked = [t for t in fig.data if t.stackgroup == "tokens"]
    assert [t.name.split(":")[0] for t in stacked] == [HIT.label] + [
        s.label for s in REASONS.values()
    ]
    (shared,) = [t for t in fig.data if t.stackgroup is None]
    assert shared.name.startswith(SHARED.label) and shared.line.dash == "dash"
    tops = [sum(values) for values in zip(*(t.y for t in stacked), strict=True)]
    assert tops == list(shared.y)


def test_every_series_says_what_it_means_and_none_is_red():
    fig = attribution_figure(attribution_frame(body(AttributionOut, ATTRIBUTION)))
    for trace in fig.data:
        series = next(s for s in [HIT, SHARED, *REASONS.values()] if trace.name.startswith(s.label))
        assert f"{series.label}: {series.short}" == trace.name  # the legend's explanation
        assert series.meaning in trace.hovertemplate
    colors = [s.color for s in [HIT, SHARED, *REASONS.values()]]
    assert len(set(colors)) == len(colors)
    for color in colors:
        rgb = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        hue, _, saturation = colorsys.rgb_to_hls(*rgb)
        assert not (saturation > 0.3 and (hue < 20 / 360 or hue > 340 / 360)), color


def test_a_request_reads_its_reasons_in_words():
    row = request(no_state=32, held_back=16)
    assert request_columns(typed(row)) == {
        "shared": 304,
        "missed": 48,
        "missed because": "32 no state · 16 held back",
        "hit stopped": "no state",
    }
    sentence = attribution_sentence(typed(row))
    assert "Shared **304** tokens" in sentence
    assert "missed **48** (32 no state · 16 held back)" in sentence
    assert "no Mamba state was kept at the attention match" in sentence
    hit = typed(row).num_cached_tokens
    assert f"left the cache at token **{hit:,}**" in sentence
    assert "diverged from the longest earlier prefix at token **304**" in sentence
    clean = request()
    assert request_columns(typed(clean))["missed because"] == "none"
    assert request_columns(typed(clean))["hit stopped"] == "match ended"
    assert "the attention match ended" in attribution_sentence(typed(clean))


def test_pending_and_old_requests_say_so():
    assert request_columns(typed(request("pending")))["missed because"] == "pending"
    assert request_columns(typed(request("pending")))["shared"] is None
    assert "**pending**" in attribution_sentence(typed(request("pending")))
    assert request_columns(typed(request(None)))["missed because"] == "not recorded"
    assert "stored before" in attribution_sentence(typed(request(None)))


def test_the_requests_figure_stacks_each_attributed_request_to_its_shared_tokens():
    rows = [
        request(no_state=32) | {"request_id": "new"},
        request("pending") | {"request_id": "waiting"},
        request(evicted=100) | {"request_id": "old"},
    ]
    fig = requests_attribution_figure([typed(r) for r in rows])
    bars = [t for t in fig.data if t.type == "bar"]
    assert list(bars[0].y) == ["old", "new"]  # newest on top; the pending one left out
    *attributed, unshared = bars
    tops = [sum(v) for v in zip(*(t.x for t in attributed), strict=True)]
    (shared,) = [t for t in fig.data if t.type == "scatter"]
    assert tops == list(shared.x) == [356, 288]
    # the rest of each 400-token prompt, which nothing before it shared
    assert unshared.name == "not shared" and list(unshared.x) == [44, 112]


def test_a_cold_request_is_a_full_bar_of_unshared_tokens():
    cold = request() | {"request_id": "cold", "num_cached_tokens": 0}
    cold["attribution"] |= {"shared_tokens": 0, "oracle_tokens": 0}
    fig = requests_attribution_figure([typed(cold)])
    widths = {t.name: sum(t.x) for t in fig.data if t.type == "bar"}
    assert widths["not shared"] == 400
    assert sum(widths.values()) == 400


GEOMETRY_JSON = {  # an engine's geometry as `GET /engines/{id}` answers it
    "prefix_match_unit": 16,
    "junction_checkpoints": True,
    "eagle": False,
    "groups": {
        "attention": {"block_size": 16, "num_blocks": 320},
        "mamba": {"block_size": 64, "num_blocks": 160},
    },
}
GEOMETRY = CacheGeometry.from_json(GEOMETRY_JSON)


def geometry(**fields) -> CacheGeometry:
    """`GEOMETRY` with `fields` changed."""
    return CacheGeometry.from_json(GEOMETRY_JSON | fields)


def test_remedies_come_most_tokens_first_with_what_they_would_have_saved():
    found = remedies(missed(no_state=32, evicted=300, copy_pending=0), 1000, GEOMETRY)
    assert [(r.reason, r.num_tokens, r.share) for r in found] == [
        ("evicted", 300, 0.3),
        ("no_state", 32, 0.032),
    ]
    assert remedies(missed(), 1000, GEOMETRY) == []
    assert remedies(missed(held_back=16), 0, GEOMETRY)[0].share == 0.0


def test_no_state_pins_the_boundary_and_turns_junctions_on_when_off():
    (on,) = remedies(missed(no_state=32), 400, GEOMETRY, boundary=288)
    assert len(on.actions) == 1
    assert "Pin this boundary (token 288)" in on.actions[0].text
    assert on.actions[0].page == CHECKPOINTS_PAGE
    junction = {"key": "ab", "boundary": 288, "num_requests": 3, "tokens_saved": 96}
    (suggested,) = remedies(
        missed(no_state=32), 400, GEOMETRY, boundary=288, junction=body(JunctionOut, junction)
    )
    assert "suggests this one (3 requests matched it; a pin would have saved them 96 tokens)" in (
        suggested.actions[0].text
    )
    (off,) = remedies(missed(no_state=32), 400, geometry(junction_checkpoints=False))
    assert "Pin these boundaries" in off.actions[0].text
    assert "--junction-checkpoints" in off.actions[1].text


def test_evicted_enlarges_the_fullest_pool_first_with_its_size():
    cache = {
        "attention": {"num_blocks": 320, "num_free": 200},
        "mamba": {"num_blocks": 160, "num_free": 3},
    }
    (remedy,) = remedies(missed(evicted=64), 400, GEOMETRY, usage(cache))
    mamba, attention, pin = (a.text for a in remedy.actions)
    assert "Enlarge the mamba pool" in mamba and "`--num-mamba-blocks`" in mamba
    assert "160 blocks of 64 tokens, 3 free now" in mamba
    assert "`--num-blocks`" in attention and "320 blocks of 16 tokens" in attention
    assert "Pin the shared prefix" in pin and remedy.actions[2].page == CHECKPOINTS_PAGE


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        ({"junction_checkpoints": False}, "--junction-checkpoints"),
        ({"max_prefix_wait_steps": 32}, "Raise `--max-prefix-wait-steps`** (now 32)"),
        ({}, "Pin the shared prefix"),
    ],
)
def test_in_flight_names_the_policy_that_fixes_it(changed: dict, says: str):
    (remedy,) = remedies(missed(in_flight=64), 400, geometry(**changed))
    assert says in remedy.actions[0].text


def test_held_back_is_explained_with_eagle_when_on():
    (plain,) = remedies(missed(held_back=16), 400, GEOMETRY)
    assert "exact resend" in plain.actions[0].text and "(16 tokens)" in plain.actions[0].text
    assert "EAGLE" not in plain.actions[0].text
    assert plain.actions[1].page == CHECKPOINTS_PAGE
    (eagle,) = remedies(missed(held_back=16), 400, geometry(eagle=True))
    assert "EAGLE" in eagle.actions[0].text


def test_restarted_says_the_cache_was_empty_and_enlarges_no_pool():
    cache = {"attention": {"num_blocks": 320, "num_free": 300}}
    (remedy,) = remedies(missed(restarted=64), 400, GEOMETRY, usage(cache))
    assert REASONS["restarted"].short == "the engine restarted; its cache was empty"
    note, pin = (a.text for a in remedy.actions)
    assert "the engine restarted; its cache was empty" in note
    assert "Pin the shared prefix" in pin and remedy.actions[1].page == CHECKPOINTS_PAGE
    assert not any("Enlarge" in a.text for a in remedy.actions)


def test_a_tier_eviction_names_the_tier_flag_and_its_size_and_a_pin():
    geometry = CacheGeometry.from_json(GEOMETRY_JSON | {"tier_bytes": {"host": 4096, "disk": 8192}})
    found = {
        r.reason: r
        for r in remedies(
            missed(evicted_host=300, evicted_disk=200, evicted_shared=50, not_admitted=100),
            1000,
            geometry,
        )
    }
    assert list(found) == ["evicted_host", "evicted_disk", "not_admitted", "evicted_shared"]
    host, disk = (found[r].actions[0].text for r in ("evicted_host", "evicted_disk"))
    assert "`--host-cache-bytes` (now 4,096 bytes)" in host
    assert "`--disk-cache-bytes` (now 8,192 bytes)" in disk
    assert "--host-cache-bytes" in found["not_admitted"].actions[0].text
    assert "TTL" in found["evicted_shared"].actions[0].text
    for remedy in found.values():
        assert any(a.page == CHECKPOINTS_PAGE for a in remedy.actions)  # and a pin
