"""Pins held for a TTL (a client's cache breakpoint, issue 51): one pin per prefix however
many requests lease it, renewed by leases and hits, released once the lease ends, within the
pin cap, and bounded in number."""

from __future__ import annotations

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.pins import PinState
from engine.request import SamplingParams
from tests.engine.conftest import tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(**cache) -> tuple[Engine, Clock]:
    base = {"block_size": 16, "mamba_block_size": 64, "prefix_match_unit": 16, "num_blocks": 400}
    engine = Engine(CacheConfig(**{**base, **cache}), SchedulerConfig(), runner="ledger")
    engine.clock = clock = Clock()
    return engine, clock


def ask(engine: Engine, prompt: list[int]) -> int:
    """Run one request to its end; its hit."""
    request = engine.add_request(prompt, SamplingParams(max_tokens=1))
    engine.run_until_done()
    return request.num_cached_tokens


def pinned(engine: Engine) -> dict[str, PinState]:
    return {pin_id: pin.state for pin_id, pin in engine.pins.items()}


def test_a_lease_pins_its_prefix_once_and_ends_after_its_ttl():
    engine, clock = make()
    system = tokens(1, 300)
    first = engine.lease_pin(system, 300.0)
    again = engine.lease_pin(system[:290], 300.0)  # the same prefix on the grid: 288
    engine.run_until_done()
    assert first is again and first.state is PinState.MATERIALIZED and first.boundary == 288
    assert list(pinned(engine)) == [first.pin_id]
    clock.now += 299.0
    ask(engine, tokens(3, 100))
    assert first.state is PinState.MATERIALIZED
    clock.now += 2.0
    ask(engine, tokens(4, 100))  # the step after the end releases it
    assert first.state is PinState.RELEASED and pinned(engine) == {}
    assert not any(
        block.pin_cnt
        for pool in engine.scheduler.coordinator.pools.values()
        for block in pool.blocks
    )


def test_a_hit_renews_the_lease_for_a_full_ttl():
    engine, clock = make()
    system = tokens(5, 288)
    pin = engine.lease_pin(system, 300.0)
    engine.run_until_done()
    clock.now += 200.0
    assert ask(engine, system + tokens(6, 50)) == 288  # a hit on the pin: held till +500
    clock.now += 250.0
    ask(engine, tokens(7, 100))
    assert pin.state is PinState.MATERIALIZED
    clock.now += 60.0
    ask(engine, tokens(8, 100))
    assert pin.state is PinState.RELEASED


def test_a_lease_over_the_pin_cap_fails_the_pin_and_never_the_requests():
    engine, clock = make(num_blocks=64, pin_max_share=0.1)
    pin = engine.lease_pin(tokens(9, 400), 300.0)  # 25 attention blocks, over a cap of 6
    engine.run_until_done()
    assert pin.state is PinState.FAILED
    assert ask(engine, tokens(10, 300)) == 0  # the pool is whole for requests
    clock.now += 301.0
    ask(engine, tokens(11, 100))
    assert pinned(engine) == {}  # the failed lease left the list when it ended


def test_leases_are_bounded_in_number():
    engine, _ = make()
    engine.leases.max_leases = 2
    assert engine.lease_pin(tokens(12, 64), 60.0) is not None
    assert engine.lease_pin(tokens(13, 64), 60.0) is not None
    assert engine.lease_pin(tokens(14, 64), 60.0) is None
    assert engine.lease_pin(tokens(12, 64), 60.0) is not None  # a renewal always fits
    assert len(engine.pins) == 2
