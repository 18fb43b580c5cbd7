"""Interval states (docs/rules.md section 5): inline, a Mamba state every `checkpoint_interval`
tokens strictly inside each prefill chunk, kept only in free blocks that hold nothing retained
longer, so a family's second request hits the interval floor of the shared prefix."""

from __future__ import annotations

import pytest

from engine.cache.block_pool import BlockPool
from engine.cache.entry import CheckpointReason
from engine.cache.mamba import MambaManager
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import ListSink
from engine.hashing import hash_prefix
from engine.request import SamplingParams
from tests.engine.conftest import tokens

ONE = SamplingParams(max_tokens=1)


def make(budget: int = 8192, **cache) -> Engine:
    config = {"block_size": 16, "mamba_block_size": 512, "num_blocks": 2048, **cache}
    return Engine(
        CacheConfig(**config), SchedulerConfig(max_num_batched_tokens=budget), runner="ledger"
    )


def test_the_default_writes_a_state_every_64_tokens_inside_each_chunk():
    e = make(budget=1024)
    (first,) = e.generate([tokens(1, 1200)], ONE)
    e.check_invariants()
    assert first.chunks == [(0, 1024), (1024, 1200)]
    interval = [p for p in range(64, 1200, 64) if p % 512 and p != 1024]
    assert sorted(first.checkpoints) == sorted({*interval, 512, 1024, 1184, 1200})  # c 1184, e 1200
    stored = {
        event.token_range[1]: event.checkpoint_reason
        for event in e.sink.events
        if event.type == "BlockStored" and event.group == "mamba"
    }
    assert {p for p, why in stored.items() if why == "interval"} == set(interval)
    assert stored[512] == "block"


@pytest.mark.parametrize(
    ("interval", "second_hit"), [(0, 512), (None, 960), (64, 960), (128, 896), (16, 992)]
)
def test_the_second_sibling_hits_the_interval_floor_and_the_third_the_junction(
    interval, second_hit
):
    e = make(checkpoint_interval=interval)
    system = tokens(1, 1000)
    hits = [e.generate([system + tokens(10 + i, 200)], ONE)[0].num_cached_tokens for i in range(3)]
    e.check_invariants()
    assert hits == [0, second_hit, 992]


@pytest.mark.parametrize(
    "cache",
    [
        {"checkpoint_mode": "stops"},
        {"partial_hits": False},
        {"enable_prefix_caching": False},
    ],
)
def test_no_interval_states_where_no_hit_can_land_between_blocks(cache):
    e = make(**cache)
    assert e.cache_config.state_interval == 0
    (first,) = e.generate([tokens(1, 1200)], ONE)
    assert not any(p % 512 and p % 64 == 0 and p < 1184 for p in first.checkpoints)


def test_interval_rounds_up_to_the_match_unit_and_bad_values_name_the_field():
    assert CacheConfig(block_size=48, mamba_block_size=480).state_interval == 96
    assert CacheConfig(checkpoint_interval=0).state_interval == 0
    with pytest.raises(ValueError, match="checkpoint_interval 40 must be a multiple"):
        CacheConfig(checkpoint_interval=40)
    with pytest.raises(ValueError, match="checkpoint_interval must be >= 0"):
        CacheConfig(checkpoint_interval=-16)


def test_interval_is_the_lowest_retention():
    reasons = [r for r in CheckpointReason if r is not CheckpointReason.INTERVAL]
    assert all(CheckpointReason.INTERVAL.retention < r.retention for r in reasons)


def test_an_interval_state_never_evicts_a_better_one():
    """Four free blocks hold junction states, one is empty: one interval write of two, and
    every junction state stays."""
    sink = ListSink()
    pool = BlockPool(5, 512, "mamba", 1, sink)
    manager = MambaManager(pool)
    hashes = hash_prefix(tokens(1, 64), 16)
    blocks = pool.allocate(4)
    for index, block in enumerate(blocks):
        block.token_start = 0
        reason = CheckpointReason.JUNCTION
        pool.cache(block.block_id, [(hashes[index], 16 * (index + 1), reason)], None)
    pool.free([b.block_id for b in blocks])
    pool.check_invariants()
    writes = [(100, 0)]
    new = manager.add_interval_writes(writes, [32, 64])
    assert len(new) == 1 and writes == [(32, new[0]), (100, 0)]
    assert len(pool.entries) == 4 and all(
        e.reason is CheckpointReason.JUNCTION for e in pool.entries.values()
    )
    assert not any(e.type == "BlockRemoved" for e in sink.events)
    assert manager.add_interval_writes(writes, [64]) == []


def test_interval_states_under_a_small_pool_keep_the_hits_of_none():
    """Pool pressure: 16 families in turn, three rounds, on a Mamba pool of 40 blocks. Interval
    states give way, so the total hit is not below the same trace without them."""

    def total(interval: int | None) -> int:
        e = make(num_mamba_blocks=40, checkpoint_interval=interval)
        hit = 0
        for round_ in range(3):
            for family in range(16):
                prompt = tokens(family, 900) + tokens(100 + 16 * family + round_, 150)
                hit += e.generate([prompt], ONE)[0].num_cached_tokens
        e.check_invariants()
        assert any(ev.type == "BlockRemoved" and ev.group == "mamba" for ev in e.sink.events)
        return hit

    without = total(0)
    assert without > 0 and total(None) >= without
