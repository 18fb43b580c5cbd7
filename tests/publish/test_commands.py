"""Control-plane commands applied to the engine: pin, a resent pin, unpin, refusals."""

from __future__ import annotations

import time

from engine.config import CacheConfig
from engine.engine import Engine
from engine.events import PinUpdated
from engine.wire import Command
from publish.commands import CommandQueue, apply_command
from serve.async_engine import AsyncEngine
from tests.engine.conftest import tokens


def make() -> Engine:
    cache = CacheConfig(block_size=16, mamba_block_size=64, prefix_match_unit=16, num_blocks=256)
    return Engine(cache, runner="ledger")


def pin_states(engine: Engine, pin_id: str) -> list[str]:
    return [e.state for e in engine.sink.events if isinstance(e, PinUpdated) and e.pin_id == pin_id]


def test_pin_then_resend_then_unpin():
    engine = make()
    system = tokens(1, 200)
    pin = Command(command="pin", payload={"pin_id": "p1", "token_ids": system})
    apply_command(engine, pin)
    engine.run_until_done()
    assert engine.pins["p1"].boundary == 192
    apply_command(engine, pin)  # resent after a reconnect: reported again, not redone
    assert pin_states(engine, "p1") == ["pending", "materialized", "materialized"]
    apply_command(engine, Command(command="unpin", payload={"pin_id": "p1"}))
    assert pin_states(engine, "p1")[-1] == "released"
    apply_command(engine, Command(command="unpin", payload={"pin_id": "unknown"}))


def test_a_pin_the_engine_cannot_take_is_reported_failed():
    engine = make()
    apply_command(engine, Command(command="pin", payload={"pin_id": "tiny", "token_ids": [1, 2]}))
    apply_command(engine, Command(command="pin", payload={"pin_id": "bad", "token_ids": "x"}))
    failed = [e for e in engine.sink.events if isinstance(e, PinUpdated)]
    assert [(e.pin_id, e.state) for e in failed] == [("tiny", "failed"), ("bad", "failed")]
    assert "boundary of 0" in failed[0].reason
    assert "list of token_ids" in failed[1].reason


def test_queued_commands_apply_on_the_engine_thread_at_the_next_step():
    engine = make()
    commands = CommandQueue()
    commands.attach(engine)
    commands.on_command(
        Command(command="pin", payload={"pin_id": "p", "token_ids": tokens(2, 100)})
    )
    assert "p" not in engine.pins
    engine.step()  # nothing to run; the listener applies the command
    engine.run_until_done()
    assert engine.pins["p"].state.value == "materialized"


def test_a_command_that_arrives_before_the_engine_loop_runs_applies_when_it_starts():
    """`junction serve` connects to the control plane before its engine loop starts, and the
    control plane sends its pins at once: an idle engine must still materialize them."""
    engine = make()
    async_engine = AsyncEngine(engine)
    commands = CommandQueue(wake=async_engine.submit)
    commands.attach(engine)
    commands.on_command(
        Command(command="pin", payload={"pin_id": "early", "token_ids": tokens(3, 100)})
    )
    assert "early" not in engine.pins
    async_engine.start()
    try:
        deadline = time.monotonic() + 10
        while pin_states(engine, "early")[-1:] != ["materialized"]:
            assert time.monotonic() < deadline, pin_states(engine, "early")
            time.sleep(0.01)
    finally:
        async_engine.shutdown()
