"""Pins in the engine: materialization, retention under a flood, stops, the cap, release."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import PinUpdated
from engine.pins import PinState
from engine.request import SamplingParams
from tests.engine.conftest import tokens
from tests.engine.ledger_harness import Harness, Submission


def make(**cache) -> Engine:
    base = {"block_size": 16, "mamba_block_size": 512, "prefix_match_unit": 16, "num_blocks": 400}
    return Engine(CacheConfig(**{**base, **cache}), SchedulerConfig(), runner="ledger")


def test_pinned_system_prompt_survives_a_flood_and_every_request_hits_it():
    e = make()
    system = tokens(1, 560)
    pin = e.pin("system", system)
    e.run_until_done()
    assert pin.state is PinState.MATERIALIZED and pin.boundary == 560
    harness = Harness(e, concurrency=4)
    flood = [Submission(tokens(100 + i, 1500), max_tokens=2) for i in range(12)]
    questions = [Submission(system + tokens(50 + i, 300), max_tokens=2) for i in range(3)]
    requests = harness.run([questions[0], *flood[:6], questions[1], *flood[6:], questions[2]])
    evicted = [ev for ev in e.sink.events if ev.type == "BlockRemoved"]
    assert evicted, "the flood must have evicted cached blocks"
    hits = [r.num_cached_tokens for r in requests if r.prompt_token_ids[:560] == system]
    assert hits == [560, 560, 560]


def test_requests_crossing_a_pinned_boundary_stop_there():
    e = make()
    system = tokens(2, 560)
    e.pin("system", system)
    e.run_until_done()
    e.unpin("system")  # released, so it no longer adds a stop...
    request = e.add_request(system + tokens(3, 100), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert 560 not in [end for _, end in request.chunks[:-1]]
    e.pin("again", system[:544])  # a second pin: active, so a request stops at 544
    e.run_until_done()
    other = e.add_request(system[:544] + tokens(4, 700), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert other.num_cached_tokens == 544


@pytest.mark.parametrize("eagle", [False, True])
def test_an_exact_resend_of_a_pinned_prefix_hits_one_unit_short(eagle: bool):
    """A hit never covers the whole prompt, so a request that is exactly the pinned prefix
    hits the resend checkpoint the pin's prefill kept, not the last Mamba block boundary."""
    e = make(eagle=eagle)
    system = tokens(7, 560)
    pin = e.pin("system", system)
    e.run_until_done()
    assert pin.state is PinState.MATERIALIZED
    request = e.add_request(list(system), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert request.num_cached_tokens == 544  # P - 1 floored to U; with EAGLE P - U, the same here
    e.check_invariants()


def test_pin_over_the_cap_fails_with_the_reason():
    e = make(pin_max_share=0.05)  # 20 of 400 attention blocks
    pin = e.pin("big", tokens(5, 560))  # needs 35 attention blocks
    e.run_until_done()
    assert pin.state is PinState.FAILED
    assert "cap is 20" in pin.reason
    assert all(pool.num_pinned == 0 for pool in e.scheduler.coordinator.pools.values())
    states = [ev.state for ev in e.sink.events if isinstance(ev, PinUpdated)]
    assert states == ["pending", "failed"]


def test_release_returns_blocks_to_the_free_queue_as_ordinary_cached_blocks():
    e = make()
    pin = e.pin("system", tokens(6, 560))
    e.run_until_done()
    pools = e.scheduler.coordinator.pools
    pinned = {g: list(ids) for g, ids in pin.block_ids.items()}
    assert pools["attention"].num_pinned == 35 and pools["mamba"].num_pinned == 1
    e.unpin("system")
    for group, block_ids in pinned.items():
        for block_id in block_ids:
            block = pools[group].blocks[block_id]
            assert block.state == "cached" and block.keys
            # the pin's own reason is gone; the resend checkpoint its prefill kept (544) stays
            reasons = {pools[group].entries[k].reason.value for k in block.keys}
            assert reasons <= {"block", "resend"}
    e.check_invariants()


def test_pin_shorter_than_the_grid_is_refused():
    e = make()
    with pytest.raises(ValueError, match="boundary of 0"):
        e.pin("tiny", tokens(7, 10))


def test_pin_of_a_cached_prefix_materializes_without_computing():
    e = make()
    system = tokens(8, 512)
    Harness(e).run([Submission(system + tokens(9, 100))])
    pin = e.pin("system", system)
    e.step()
    assert pin.state is PinState.MATERIALIZED
    assert e.last_output.chunks == []


def test_a_pin_on_a_running_requests_live_checkpoint_leaves_it_pinned():
    """A request and a pin of its whole prompt in flight together, 4 tokens a step: the
    request registers a checkpoint in its live Mamba block and the pin materializes on that
    very block. The request then goes on in a private copy; the pinned state stays as it was
    (found by the property test once pins were made while requests run)."""
    cache = CacheConfig(
        block_size=4,
        mamba_block_size=16,
        prefix_match_unit=2,
        num_blocks=64,
        checkpoint_mode="stops",
    )
    e = Engine(cache, SchedulerConfig(max_num_batched_tokens=4), runner="ledger")
    prompt = tokens(9, 18)
    request = e.add_request(prompt, SamplingParams(max_tokens=6))
    pin = e.pin("live", prompt)
    while e.has_unfinished():
        e.step()
        e.check_invariants()
    assert pin.state is PinState.MATERIALIZED and pin.boundary == 18
    assert request.finish_reason == "length"
    consumer = [c for c in request.cow_copies if c.path == "consumer"]
    assert [(c.group, c.src) for c in consumer] == [("mamba", pin.block_ids["mamba"][0])]
    resend = e.add_request(prompt + tokens(10, 3), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert resend.num_cached_tokens == 18  # the pinned state, intact: the ledger checked it
