"""Miss-ratio curves (whatif/curves.py) against an independent model: an LRU cache of
`C` blocks simulated request by request, at every `C`."""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.whatif_traffic import conversations
from engine.config import CacheConfig, SchedulerConfig
from engine.geometry import CacheGeometry
from engine.hashing import hash_prefix
from whatif import curves
from whatif.curves import (
    block_stream,
    default_sizes,
    lru_curve,
    policy_curve,
    sample_recording,
    sample_stream,
    shards_curve,
    stack_distances,
)
from whatif.recording import RecordedRequest, Recording


def unit_chain(token_ids: list[int], unit: int, salt: str | None = None) -> list[int]:
    """The recording's form of a chain: the first 8 bytes of each unit hash, as an int."""
    return [int.from_bytes(h[:8], "little") for h in hash_prefix(token_ids, unit, salt)]


def recording_of(sequences: list[tuple[list[int], int]], unit: int, block_size: int) -> Recording:
    """A recording of (prompt + output token ids, prompt length) pairs, in order."""
    requests = [
        RecordedRequest(
            f"r{i}",
            unit_chain(tokens, unit),
            num_prompt_tokens=prompt,
            num_output_tokens=len(tokens) - prompt,
            arrival_index=i,
        )
        for i, (tokens, prompt) in enumerate(sequences)
    ]
    return Recording(CacheGeometry(block_size=block_size), unit, requests)


def lru_hit_tokens(recording: Recording, block_size: int, size: int) -> int:
    """The independent model: an LRU cache of `size` blocks. Each request hits its leading
    full prompt blocks the cache holds (capped at P - 1 floored to the unit), then uses all
    its blocks deepest first and the cache drops the least recent down to `size`."""
    unit, cache, total = recording.unit, OrderedDict(), 0
    step = block_size // unit
    for request in recording.requests:
        keys = request.units[step - 1 :: step]
        num_prompt_blocks = request.num_prompt_tokens // block_size
        held = 0
        while held < num_prompt_blocks and keys[held] in cache:
            held += 1
        cap = max(request.num_prompt_tokens - 1, 0) // unit * unit
        total += min(held * block_size, cap)
        for key in reversed(keys):
            cache[key] = True
            cache.move_to_end(key)
        while len(cache) > size:
            cache.popitem(last=False)
    return total


@st.composite
def traces(draw) -> tuple[Recording, int]:
    """Small traces whose prompts share prefixes: a few families (a system prompt), turns
    that extend an earlier request's prompt and output, and a small alphabet."""
    unit = draw(st.sampled_from([1, 2, 4]))
    block_size = unit * draw(st.integers(1, 3))
    rng = random.Random(draw(st.integers(0, 2**32)))
    families = [[rng.randrange(3) for _ in range(rng.randrange(0, 12))] for _ in range(3)]
    sequences: list[tuple[list[int], int]] = []
    for _ in range(draw(st.integers(1, 30))):
        if sequences and rng.random() < 0.4:  # a next turn of an earlier request
            base, _ = rng.choice(sequences)
        else:
            base = rng.choice(families)
        prompt = base + [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        if not prompt:
            prompt = [rng.randrange(3)]
        output = [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        sequences.append((prompt + output, len(prompt)))
    return recording_of(sequences, unit, block_size), block_size


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_the_one_pass_curve_is_the_lru_cache_at_every_size(trace) -> None:
    recording, block_size = trace
    stream = block_stream(recording, block_size)
    working_set = len(set(stream.keys.tolist()))
    sizes = list(range(0, working_set + 2))
    curve = lru_curve(stream, sizes)
    expected = [lru_hit_tokens(recording, block_size, size) for size in sizes]
    assert curve.hit_tokens.tolist() == expected
    assert curve.num_prompt_tokens == recording.num_prompt_tokens


@settings(max_examples=60, deadline=None)
@given(traces())
def test_shards_at_rate_one_is_the_exact_curve(trace) -> None:
    recording, block_size = trace
    stream = block_stream(recording, block_size)
    sizes = default_sizes(stream, 8)
    assert shards_curve(stream, sizes, 1.0).hit_tokens.tolist() == (
        lru_curve(stream, sizes).hit_tokens.tolist()
    )


def test_a_worked_trace() -> None:
    """Ba 2 = U: A (6 tokens), B sharing A's first 4, A again. Sizes in blocks."""
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9]
    recording = recording_of([(a, 6), (b, 6), (a, 6)], unit=2, block_size=2)
    stream = block_stream(recording, 2)
    # A leaves the stack a0 a1 a2 (root on top); B finds a0, a1 at 0, 1 and leaves a0 a1 b2
    # a2; A again finds a0, a1 at 0, 1 and a2 under three blocks
    assert stack_distances(stream.keys, stream.starts).tolist() == [-1, -1, -1, 0, 1, -1, 0, 1, 3]
    # the cap: a 6-token prompt hits at most 5, floored to the unit: 4
    assert lru_curve(stream, [0, 1, 2, 3, 4]).hit_tokens.tolist() == [0, 4, 8, 8, 8]


def test_weights_keep_to_full_prompt_blocks_and_the_cap() -> None:
    # P 7, output 5, U 1, Ba 3: blocks [0,3) [3,6) [6,9) [9,12); the hit cap is 6
    recording = recording_of([(list(range(12)), 7)], unit=1, block_size=3)
    assert block_stream(recording).weights.tolist() == [3, 3, 0, 0]
    recording = recording_of([(list(range(6)), 6)], unit=1, block_size=3)
    assert block_stream(recording).weights.tolist() == [3, 2]  # P 6: 5 tokens at most


def test_a_block_size_off_the_unit_is_refused() -> None:
    recording = recording_of([([1, 2, 3, 4], 4)], unit=2, block_size=2)
    try:
        block_stream(recording, 3)
    except ValueError as exc:
        assert "not a multiple of the recording's unit 2" in str(exc)
    else:
        raise AssertionError("a block of 3 tokens over units of 2 was taken")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(1, 5)), max_size=40),
    st.lists(st.tuples(st.integers(0, 21), st.integers(-1, 20)), min_size=1, max_size=20),
)
def test_dominance_sums_count_what_a_loop_counts(events, queries) -> None:
    x, y, w = (
        (np.array(column, np.int64) for column in zip(*events, strict=True))
        if events
        else (np.zeros(0, np.int64),) * 3
    )
    qx, qy = (np.array(column, np.int64) for column in zip(*queries, strict=True))
    expected = [sum(wi for xi, yi, wi in events if xi < a and yi > b) for a, b in queries]
    assert curves._dominance_sums(x, y, w, qx, qy).tolist() == expected


def test_keys_that_share_their_high_bits_are_told_apart(monkeypatch) -> None:
    # unspread, 5 and 6 agree above the two position bits of a 4-block stream
    monkeypatch.setattr(curves, "_spread", lambda keys: keys)
    keys = np.array([5, 6, 5, 6], np.uint64)
    assert curves._last_users(keys, np.array([0, 1, 2, 3])).tolist() == [-1, -1, 0, 1]


def test_a_chain_that_repeats_a_key_is_refused() -> None:
    try:
        stack_distances(np.array([7, 7], np.uint64), np.array([0, 2]))
    except ValueError as exc:
        assert "not one chain" in str(exc)
    else:
        raise AssertionError("a request that used one key twice was taken")


def test_shards_keeps_about_its_rate_and_stays_near_the_exact_curve() -> None:
    rng = random.Random(7)
    families = [[rng.randrange(1000) for _ in range(rng.randrange(64, 256))] for _ in range(40)]
    sequences = []
    for _ in range(3000):
        prompt = rng.choice(families) + [rng.randrange(1000) for _ in range(rng.randrange(16, 96))]
        sequences.append((prompt, len(prompt)))
    stream = block_stream(recording_of(sequences, 16, 16))
    sample = sample_stream(stream, 0.1)
    assert 0.07 < len(sample.keys) / len(stream.keys) < 0.13
    sizes = default_sizes(stream, 12)
    exact, sampled = lru_curve(stream, sizes), shards_curve(stream, sizes, 0.1)
    assert np.max(np.abs(exact.hit_rates - sampled.hit_rates)) < 0.05


@pytest.mark.parametrize("by", ["traffic", "hash"])
def test_a_recording_sample_keeps_families_whole(by) -> None:
    rng = random.Random(3)
    families = [[rng.randrange(100) for _ in range(32)] for _ in range(50)]
    sequences = [(f + [rng.randrange(100) for _ in range(8)], 40) for f in families * 4]
    recording = recording_of(sequences, 8, 16)
    sample = sample_recording(recording, 0.3, by)
    roots = {r.units[0] for r in recording.requests}
    kept_roots = {r.units[0] for r in sample.requests}
    assert 0 < len(kept_roots) < len(roots)
    for root in kept_roots:  # every request of a kept family is kept
        assert sum(r.units[0] == root for r in sample.requests) == 4
    if by == "traffic":  # one family in every 1 / rate, down the ranking
        assert len(kept_roots) == 15


def test_a_traffic_sample_holds_about_its_rate_of_the_traffic() -> None:
    recording = conversations(2000, num_families=80, system_len=200, user_len=40, answer_len=40)
    total = sum(r.num_prompt_tokens + r.num_output_tokens for r in recording.requests)
    sample = sample_recording(recording, 0.25)
    kept = sum(r.num_prompt_tokens + r.num_output_tokens for r in sample.requests)
    assert 0.2 < kept / total < 0.3


def _small_conversations() -> Recording:
    recording = conversations(
        300, seed=2, num_families=40, system_len=200, user_len=40, answer_len=40
    )
    recording.concurrency = 2
    return recording


def test_a_full_rate_policy_curve_is_the_replay_at_each_size() -> None:
    run = pytest.importorskip("whatif.run")
    recording = _small_conversations()
    recording.requests = recording.requests[:80]
    cache, scheduler = CacheConfig(), SchedulerConfig()
    points = policy_curve(recording, cache, scheduler, [300, 900], 1.0)
    for point in points:
        config = dataclasses.replace(cache, num_blocks=point.size, num_mamba_blocks=point.size)
        hits = run.replay_setting(recording, config, scheduler).hits
        assert point.hit_rate == sum(hits) / recording.num_prompt_tokens
        assert point.num_blocks == point.size


def test_sampled_replays_stay_near_full_replays() -> None:
    """The default policy with Mamba states, a half sample of 40 families against the whole
    recording, at a quarter, half and all of its distinct blocks. The bound is loose (3
    points; measured 0.9, and 4.3 for the replays without the LRU control variate): a few
    popular families carry most of the hits, and a sample keeps a family whole or not at
    all (docs/benchmarks.md has the figures at scale)."""
    pytest.importorskip("whatif.run")
    recording = _small_conversations()
    working_set = len(np.unique(block_stream(recording).keys))
    sizes = [working_set // 4, working_set // 2, working_set]
    cache, scheduler = CacheConfig(), SchedulerConfig()
    full = policy_curve(recording, cache, scheduler, sizes, 1.0)
    sampled = policy_curve(recording, cache, scheduler, sizes, 0.5)
    assert all(0.3 < p.hit_rate < 0.95 for p in full)  # under pressure, and hitting
    assert full[0].hit_rate < full[-1].hit_rate
    errors = [abs(f.hit_rate - s.hit_rate) for f, s in zip(full, sampled, strict=True)]
    assert max(errors) < 0.03
    assert all(s.num_blocks < f.num_blocks for f, s in zip(full, sampled, strict=True))
