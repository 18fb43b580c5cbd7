"""A what-if replays hashes through the engine itself: its own settings give back every hit the
engine recorded, and another setting gives what a real replay with it gives, request by
request."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cache.eviction import EVICTION_POLICIES
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.traces.replay import replay
from engine.traces.trace import TracePin, TraceRequest
from tests.engine.test_properties import geometries
from whatif.recording import ChainSink, Recording, dump_lines, from_events, load_lines
from whatif.run import run_whatif, synthesize
from whatif.settings import WhatIfSetting, apply, parse_settings
from workloads import build_workload


def record(items, cache: CacheConfig, concurrency: int | None, window: int = 1):
    """Replay `items` for real (window `window`) and keep its recording; `concurrency` None
    records arrival steps only."""
    sink = ChainSink()
    engine = Engine(cache, SchedulerConfig(), runner="null", sink=sink)
    records, _ = replay(engine, items, concurrency=window)
    hits = [r["num_cached_tokens"] for r in records if r["type"] == "request"]
    return from_events(engine.cache_geometry(), sink.events, concurrency), hits


def real_hits(items, cache: CacheConfig, window: int) -> list[int]:
    records, _ = replay(Engine(cache, SchedulerConfig(), runner="null"), items, concurrency=window)
    return [r["num_cached_tokens"] for r in records if r["type"] == "request"]


PRESSURE = [
    ("multi_turn", True, 4, 600, 150),
    ("agentic", True, 8, 600, 150),
    ("chat_agentic", False, 4, 600, 150),  # chat messages: message checkpoints
]
TRIED = [
    WhatIfSetting(eviction="lru"),
    WhatIfSetting(block_size=32, mamba_block_size=256),
    WhatIfSetting(mode="vllm"),
    WhatIfSetting(checkpoint_interval=0, num_mamba_blocks=600),
    WhatIfSetting(num_blocks=2400, num_mamba_blocks=600),
]


@pytest.mark.parametrize(("kind", "pins", "window", "blocks", "states"), PRESSURE)
def test_replaying_what_ran_gives_back_every_recorded_hit_and_each_setting_a_real_replays(
    kind, pins, window, blocks, states
):
    items = build_workload({"kind": kind}).items(with_pins=pins)
    cache = CacheConfig(num_blocks=blocks, num_mamba_blocks=states)
    recording, recorded = record(items, cache, window, window)
    report = run_whatif(recording, TRIED)
    assert report.as_ran.hits == recorded
    assert report.exact and report.agreement == len(recorded)
    for setting, result in zip(TRIED, report.results, strict=True):
        assert result.hits == real_hits(items, apply(setting, cache, 16), window), setting
    # the memory was short: four times of it hits more, so the recording holds evictions
    assert report.results[-1].hit_tokens > report.as_ran.hit_tokens
    for result in [report.as_ran, *report.results]:
        assert result.hit_tokens <= result.oracle_tokens
        assert result.bound_tokens <= result.oracle_tokens


def test_arrival_steps_replay_a_live_engines_interleaving():
    """Without a window, requests enter at the step they arrived in: what a served engine's
    recording has."""
    items = build_workload({"kind": "agentic"}).items()
    recording, recorded = record(items, CacheConfig(num_blocks=500, num_mamba_blocks=120), None, 8)
    assert {r.arrival_step for r in recording.requests} != {0}
    assert run_whatif(recording, []).as_ran.hits == recorded


#: `cost` counts recurrences in a table indexed by hash bits, and a what-if's hashes are not
#: the engine's: where two prefixes shared a slot, its replay may count them apart
EXACT_POLICIES = [name for name in EVICTION_POLICIES if name != "cost"]


@st.composite
def traces(draw):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    lengths = [200, rng.randint(8, 200), rng.randint(8, 200)]
    bases = [[rng.randrange(256) for _ in range(n)] for n in lengths]
    items = []
    for index in range(draw(st.integers(2, 20))):
        base = rng.choice(bases)
        if rng.random() < 0.1:  # a pin of at least the coarsest hit grid drawn (128)
            items.append(TracePin(index + 1, f"p{index}", bases[0][: rng.randint(128, 200)], None))
            continue
        shared = rng.randint(0, len(base))
        prompt = base[:shared] + [rng.randrange(256) for _ in range(rng.randint(1, 60))]
        items.append(
            TraceRequest(index + 1, f"r{index}", prompt, rng.randint(1, 24), None, 1.0, 1.0, None)
        )
    if not any(isinstance(item, TraceRequest) for item in items):
        items.append(TraceRequest(99, "last", bases[0], 3, None, 1.0, 1.0, None))
    return items


def sized(cache: CacheConfig, items, slack: int) -> CacheConfig:
    """Pools that hold the longest request and its pins, plus `slack` blocks of each."""
    longest = max(len(i.token_ids) + 24 for i in items)
    pinned = sum(len(i.token_ids) for i in items if isinstance(i, TracePin))
    attention = -(-(longest + pinned) // cache.attention_block_size) + 2 + slack
    mamba = -(-longest // cache.mamba_block_size) + 5 + len(items) + slack
    return dataclasses.replace(cache, num_blocks=attention, num_mamba_blocks=mamba)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    geometry=geometries(),
    items=traces(),
    window=st.integers(1, 6),
    slack=st.integers(0, 12),
    other=st.sampled_from(EXACT_POLICIES),
    ran=st.sampled_from(EXACT_POLICIES),
    pin_share=st.sampled_from([0.1, 0.25, 1.0]),
)
def test_any_trace_replays_exactly_from_its_hashes(
    geometry, items, window, slack, other, ran, pin_share
):
    cache = dataclasses.replace(
        sized(geometry, items, slack), eviction=ran, pin_max_share=pin_share
    )
    recording, recorded = record(items, cache, window, window)
    tried = WhatIfSetting(eviction=other, num_blocks=cache.num_blocks + 4)
    report = run_whatif(recording, [tried])
    assert report.as_ran.hits == recorded
    assert report.results[0].hits == real_hits(items, apply(tried, cache, cache.match_unit), window)


def test_synthetic_units_agree_exactly_where_the_hashes_do():
    unit = 4
    from whatif.recording import RecordedRequest

    a = RecordedRequest("a", [11, 12, 13], 12, 2, arrival_index=0)
    b = RecordedRequest("b", [11, 12, 99], 13, 0, arrival_index=1)
    ta, tb = synthesize(a, unit), synthesize(b, unit)
    assert (len(ta), len(tb)) == (14, 13)
    assert ta[:8] == tb[:8] and ta[8:12] != tb[8:12]
    assert ta[12:] != tb[12:13] * 2  # the tails past the chains are each request's own


def test_a_unit_finer_than_the_recordings_is_refused_naming_the_field():
    items = build_workload({"kind": "multi_turn"}).items()
    recording, _ = record(items[:4], CacheConfig(num_blocks=600), 1)
    with pytest.raises(ValueError, match="prefix_match_unit 8 is not a multiple .* unit 16"):
        run_whatif(recording, [WhatIfSetting(prefix_match_unit=8, block_size=16)])
    with pytest.raises(ValueError, match="needs .* attention blocks, but num_blocks is 20"):
        run_whatif(recording, [WhatIfSetting(num_blocks=20)])
    with pytest.raises(ValueError, match=r"setting 1: blok_size: unknown field \(fields: label"):
        parse_settings([{}, {"blok_size": 32}])
    with pytest.raises(ValueError, match="setting 0: eviction: Input should be"):
        parse_settings([{"eviction": "belady"}])


def test_a_recording_round_trips_through_its_lines_and_a_bad_line_is_named():
    items = build_workload({"kind": "multi_turn"}).items(with_pins=True)
    recording, _ = record(items[:6], CacheConfig(num_blocks=600), 2, 2)
    lines = list(dump_lines(recording))
    assert load_lines(lines) == recording
    assert isinstance(load_lines(lines), Recording)
    with pytest.raises(ValueError, match="recording line 3 \\(a request\\)"):
        load_lines([*lines[:2], b'{"id": "x"}'])
    with pytest.raises(ValueError, match="recording line 1: not JSON"):
        load_lines([b"{"])
    with pytest.raises(ValueError, match="the recording is empty"):
        load_lines([])


def test_a_pin_a_setting_cannot_place_is_said_and_the_run_goes_on():
    """An 80-token pin on a 16-token grid: "as vLLM would" hits on 512-token Mamba blocks only,
    so it cannot place the pin; that setting runs without it, by name in the report and the
    table (issue 47, item 14)."""
    from rich.console import Console

    from whatif.table import report_table

    rng = random.Random(0)
    system = [rng.randrange(1, 30000) for _ in range(80)]
    items = [TracePin(1, "support", system, None)]
    items += [
        TraceRequest(i + 2, f"r{i}", system + [rng.randrange(1, 30000) for _ in range(40)], 8,
                     None, 1.0, 1.0, None)
        for i in range(6)
    ]  # fmt: skip
    recording, recorded = record(items, CacheConfig(num_blocks=200, num_mamba_blocks=40), 1)
    vllm = WhatIfSetting(label="As vLLM would", mode="vllm")
    report = run_whatif(recording, [vllm, WhatIfSetting(eviction="lru")])
    assert report.as_ran.hits == recorded and report.as_ran.pins_not_placed == []
    by_label = {result.label: result for result in report.results}
    [unplaced] = by_label["As vLLM would"].pins_not_placed
    assert unplaced["pin"] == "support"
    assert "80 tokens floor to a boundary of 0" in unplaced["reason"]
    assert by_label["lru"].pins_not_placed == [] and by_label["lru"].hit_tokens > 0
    console = Console(width=200, record=True)
    console.print(report_table(report))
    assert "As vLLM would: pin 'support' not placed (its 80 tokens" in console.export_text()
