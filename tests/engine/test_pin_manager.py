"""The pin manager on its own: boundaries a request keeps, hits, and its invariants."""

from __future__ import annotations

import pytest

from engine.cache.block_pool import InvariantError
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.pins import PinState
from engine.request import SamplingParams
from tests.engine.conftest import tokens


def make(**cache) -> Engine:
    base = {"block_size": 16, "mamba_block_size": 64, "prefix_match_unit": 16, "num_blocks": 200}
    return Engine(CacheConfig(**{**base, **cache}), SchedulerConfig(), runner="ledger")


def test_a_pin_queues_its_prefill_floored_to_the_hit_grid():
    e = make()
    manager = e.scheduler.pin_manager
    pin = e.pin("sys", tokens(1, 75))
    assert (pin.boundary, pin.request_id) == (64, "pin:sys")
    prefill = e.scheduler.requests["pin:sys"]
    assert prefill.num_prompt_tokens == 64 and prefill.sampling.max_tokens == 0
    assert manager.boundaries(prefill) == [64]
    with pytest.raises(ValueError, match="already exists"):
        e.pin("sys", tokens(1, 75))


def test_requests_keep_active_pins_inside_their_prompt_and_record_the_pins_they_hit():
    e = make()
    manager = e.scheduler.pin_manager
    system = tokens(1, 64)
    e.pin("sys", system)
    e.pin("other", tokens(2, 64))
    e.run_until_done()
    request = e.add_request(system + tokens(3, 30), SamplingParams(max_tokens=1))
    assert manager.boundaries(request) == [64]
    e.run_until_done()
    assert request.pin_hits == {"sys": 64} == manager.hits(request, 64)
    assert manager.hits(request, 48) == {}
    e.unpin("sys")
    assert manager.boundaries(request) == []
    assert manager.num_pins == 2  # a released pin stays listed
    e.check_invariants()


def test_prefix_caching_off_fails_the_pin_at_once():
    e = make(enable_prefix_caching=False)
    pin = e.pin("sys", tokens(1, 64))
    assert pin.state is PinState.FAILED and "prefix caching is off" in pin.reason
    assert not e.has_unfinished()


def test_invariants_catch_a_materialized_pin_whose_block_is_not_pinned():
    e = make()
    pin = e.pin("sys", tokens(1, 64))
    e.run_until_done()
    assert pin.state is PinState.MATERIALIZED
    e.check_invariants()
    e.scheduler.coordinator.mamba.pool.unpin(pin.block_ids["mamba"][0])
    with pytest.raises(InvariantError, match="held by pin sys but not pinned"):
        e.scheduler.pin_manager.check_invariants()
