"""The router's index, fed only by an engine's cache feed, predicts the engine's own lookup.

Random traces (families sharing prefixes at random lengths, resends, extensions, pins, small
pools that evict) run through an engine whose sink is the feed's; after every step the frames
go into an `EngineIndex`, and for random probes the index's hit equals the coordinator's
lookup, both groups' key sets equal the pools' entries, and the engine's invariants hold.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.feed import FeedHub, FeedSink, FeedSubscriber, decode
from engine.hashing import hash_prefix
from engine.request import SamplingParams
from router.engines import FleetEngine

MAX_TOKENS = 256  # the longest prompt + output a trace below makes


@st.composite
def geometries(draw) -> CacheConfig:
    """Pools that hold one request of the longest with little to spare, so they evict."""
    unit = draw(st.sampled_from([2, 4, 8]))
    block = unit * draw(st.sampled_from([1, 2, 4]))
    mamba = unit * draw(st.sampled_from([2, 4, 8, 16]))
    return CacheConfig(
        block_size=block,
        mamba_block_size=mamba,
        prefix_match_unit=unit,
        eagle=draw(st.booleans()),
        partial_hits=draw(st.booleans()) or draw(st.booleans()),
        junction_checkpoints=draw(st.booleans()),
        checkpoint_mode=draw(st.sampled_from(["stops", "inline"])),
        num_blocks=-(-MAX_TOKENS // block) + 8 + draw(st.integers(0, 64)),
        num_mamba_blocks=-(-MAX_TOKENS // mamba) + 12 + draw(st.integers(0, 24)),
    )


def _follow(engine: Engine, hub: FeedHub) -> tuple[FleetEngine, FeedSubscriber]:
    subscriber = FeedSubscriber(lambda: None)
    fleet_engine = FleetEngine("http://engine")
    for frame in hub.subscribe(engine, subscriber):
        fleet_engine.apply(frame)
    return fleet_engine, subscriber


def _check(engine: Engine, fleet_engine: FleetEngine, probes: list[list[int]]) -> None:
    engine.check_invariants()
    coordinator = engine.scheduler.coordinator
    index = fleet_engine.index
    assert index is not None and index.is_ready
    assert set(index.groups[0]) == set(coordinator.attention.pool.entries)
    assert set(index.groups[1]) == set(coordinator.mamba.pool.entries)
    unit = coordinator.unit
    for prompt in probes:
        hashes = hash_prefix(prompt, unit)
        expected = coordinator.lookup(hashes, len(prompt), True)
        found = index.hit(hashes, len(prompt))
        got = (found.length, found.attention_length) if found else (0, 0)
        assert got == (expected.length, expected.attention_length), prompt[:8]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=geometries(), seed=st.integers(0, 2**32 - 1), late=st.booleans())
def test_the_index_fed_by_the_feed_predicts_the_engines_lookup(config, seed, late):
    rng = random.Random(seed)
    hub = FeedHub()
    engine = Engine(
        config,
        SchedulerConfig(max_num_batched_tokens=rng.choice([32, 64, 256])),
        runner="null",
        sink=FeedSink(hub, keep_events=False),
    )
    hub.attach(engine)
    bases = [[rng.randrange(256) for _ in range(rng.randint(16, 200))] for _ in range(3)]
    # at most 200 + 40 prompt tokens and 6 output tokens: under MAX_TOKENS
    prompts: list[list[int]] = []
    fleet_engine = subscriber = None
    if not late:
        fleet_engine, subscriber = _follow(engine, hub)
    for step in range(rng.randint(20, 60)):
        if rng.random() < 0.4:
            base = rng.choice(bases)
            if prompts and rng.random() < 0.3:
                prompt = list(rng.choice(prompts))  # a resend
            else:
                cut = rng.randint(1, len(base))
                prompt = base[:cut] + [rng.randrange(256) for _ in range(rng.randint(0, 40))]
            prompts.append(prompt)
            engine.add_request(prompt, SamplingParams(max_tokens=rng.randint(1, 6)))
        if rng.random() < 0.05 and not engine.pins and prompts:
            try:
                engine.pin(f"pin-{step}", rng.choice(prompts))
            except ValueError:
                pass  # shorter than the hit grid, or more than the pins' share: refused
        elif rng.random() < 0.05 and engine.pins:
            engine.unpin(next(iter(engine.pins)))
        if engine.has_unfinished():
            engine.step()
        if fleet_engine is None and step >= 5:
            fleet_engine, subscriber = _follow(engine, hub)  # joins mid-run: a snapshot
        if fleet_engine is not None:
            for frame in subscriber.take():
                fleet_engine.apply(frame)
            probes = [rng.choice(prompts) for _ in range(3)] if prompts else []
            probes += [base[: rng.randint(1, len(base))] + [7, 7, 7] for base in bases]
            _check(engine, fleet_engine, probes)


def test_a_gap_in_the_feed_takes_the_engine_out_until_a_new_snapshot():
    hub = FeedHub()
    engine = Engine(
        CacheConfig(block_size=4, mamba_block_size=8),
        runner="null",
        sink=FeedSink(hub, keep_events=False),
    )
    hub.attach(engine)
    fleet_engine, subscriber = _follow(engine, hub)
    assert fleet_engine.is_up
    engine.generate([list(range(40))], SamplingParams(max_tokens=2))
    frames = subscriber.take()
    assert frames, "the steps stored keys, so the feed sent deltas"
    try:
        for frame in frames[1:]:  # the first delta is lost
            fleet_engine.apply(frame)
    except RuntimeError as exc:
        assert "gap" in str(exc)
    else:
        raise AssertionError("a delta after a lost one was applied")
    assert not fleet_engine.is_up
    assert decode(frames[0]).seq == 1
