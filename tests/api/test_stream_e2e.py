"""End to end over real processes: a replay streams to `junction api` on PostgreSQL over a real
websocket, and the store's block table equals the engine's own snapshot, block by block. Also
after the API process is killed and restarted mid-stream, and after the engine's buffer
overflows during a long disconnect."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from publish.publisher import EventPublisher
from tests.api.processes import AUTH, TOKEN, ApiProcess
from tests.serve.conftest import finished_event


def small_engine(engine_id: str) -> Engine:
    """Pools small enough that 6 concurrent requests evict and preempt each other."""
    cache = CacheConfig(
        block_size=4,
        mamba_block_size=16,
        prefix_match_unit=2,
        num_blocks=96,
        num_mamba_blocks=48,
        junction_checkpoints=True,
        checkpoint_mode="stops",  # chunks stop inside live blocks: producer copies and moves
    )
    return Engine(
        cache, SchedulerConfig(max_num_batched_tokens=96), runner="ledger", engine_id=engine_id
    )


def workload(seed: int, num: int) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(256) for _ in range(rng.randint(30, 70))] for _ in range(3)]
    return [
        rng.choice(systems) + [rng.randrange(256) for _ in range(rng.randint(5, 90))]
        for _ in range(num)
    ]


def run(engine: Engine, prompts: list[list[int]], concurrency: int = 6, on_step=None) -> None:
    pending = list(prompts)
    steps = 0
    while pending or engine.has_unfinished():
        while (
            pending and len(engine.scheduler.running) + len(engine.scheduler.waiting) < concurrency
        ):
            engine.add_request(pending.pop(0), SamplingParams(max_tokens=8))
        engine.step()
        steps += 1
        if on_step is not None:
            on_step(steps)


def assert_store_matches(api: ApiProcess, engine: Engine) -> None:
    stored = api.blocks(engine.engine_id)
    expected = engine.snapshot()["blocks"]
    assert len(stored) == len(expected)
    for mine, theirs in zip(expected, stored, strict=True):
        assert mine == theirs, (mine, theirs)


def exercised(engine: Engine) -> set[str]:
    return {e.type for e in engine.sink.events}


@pytest.fixture
def publisher(api_process: ApiProcess) -> Iterator[EventPublisher]:
    with EventPublisher(api_process.url, TOKEN) as publisher:
        yield publisher


def test_replay_streams_and_the_store_equals_the_engine(api_process, publisher):
    api = api_process
    engine = small_engine("e2e-plain")
    seen: set[str] = set()
    engine.step_listeners.append(lambda e: seen.update(ev.type for ev in e.sink.events))
    publisher.attach(engine)
    run(engine, workload(1, 40))
    assert publisher.flush(60), publisher.stats()
    assert {"BlockRemoved", "BlockCopied", "BlockHashesMoved"} <= seen
    assert engine.stats.num_preemptions > 0
    assert_store_matches(api, engine)
    info = httpx.get(f"{api.url}/api/v1/engines/e2e-plain", headers=AUTH, timeout=10).json()
    assert info["num_requests"] == 40


def test_api_killed_and_restarted_mid_stream(api_process, publisher):
    api = api_process
    engine = small_engine("e2e-restart")
    publisher.attach(engine)
    deadline = time.monotonic() + 30  # connected before the kill, so the restart is a reconnect
    while not publisher.stats().is_connected and time.monotonic() < deadline:
        time.sleep(0.05)

    def chaos(step: int) -> None:
        if step == 40:
            api.kill()
        if step == 120:
            api.start()

    run(engine, workload(2, 50), on_step=chaos)
    assert publisher.flush(60), publisher.stats()
    assert publisher.stats().num_connections >= 2
    assert_store_matches(api, engine)


def test_buffer_overflow_during_a_long_disconnect_sends_a_snapshot(api_process):
    api = api_process
    engine = small_engine("e2e-overflow")
    with EventPublisher(api.url, TOKEN, max_batches=8, binary=True) as publisher:
        publisher.attach(engine)
        run(engine, workload(3, 10))
        assert publisher.flush(30)
        api.kill()
        run(engine, workload(4, 40))  # far more than 8 batches while the store is away
        api.start()
        assert publisher.flush(60), publisher.stats()
        stats = publisher.stats()
    assert stats.num_snapshots >= 1 and stats.num_dropped > 0
    assert_store_matches(api, engine)


def test_a_table_of_100k_blocks_per_group_converges_through_a_chunked_snapshot(api_process):
    api = api_process
    cache = CacheConfig(
        block_size=16, mamba_block_size=64, prefix_match_unit=16, num_blocks=100_000
    )
    engine = Engine(cache, SchedulerConfig(), runner="ledger", engine_id="e2e-100k")
    run(engine, workload(5, 20))  # before the publisher came: it starts from a snapshot
    rows = engine.snapshot()["blocks"]
    assert len(rows) == 200_000
    started = time.monotonic()
    with EventPublisher(api.url, TOKEN) as publisher:
        publisher.attach(engine)
        assert publisher.flush(240), publisher.stats()
        took = time.monotonic() - started
        stats = publisher.stats()
    assert stats.num_snapshots == 1 and stats.num_requests_dropped == 0
    assert_store_matches(api, engine)
    print(f"\n200,000 block rows (100,000 per group) converged in {took:.1f} s")


def test_a_frame_the_store_refuses_is_dropped_after_retries_and_the_stream_goes_on(api_process):
    """A poison frame (a 10 KB request id, which the control plane refuses at its edge with
    4400) costs its own requests, counted, and nothing else: the engine backs off, drops it
    after three refusals, resyncs through a snapshot, and its later requests all land."""
    api = api_process
    engine = small_engine("e2e-poison")
    with EventPublisher(api.url, TOKEN) as publisher:
        publisher.attach(engine)
        run(engine, workload(6, 5))
        assert publisher.flush(30), publisher.stats()
        poison = msgspec.structs.replace(finished_event("x"), request_id="x" * 10_000)
        engine.sink.emit(poison)  # as if the engine had finished it in its next step
        run(engine, workload(7, 10))
        assert publisher.flush(60), publisher.stats()
        stats = publisher.stats()
    assert stats.num_requests_dropped == 1 and stats.num_snapshots >= 1
    assert "refused the batch at seq" in stats.last_drop and "3 times" in stats.last_drop
    info = httpx.get(f"{api.url}/api/v1/engines/e2e-poison", headers=AUTH, timeout=10).json()
    assert info["num_requests"] == 15  # every request but the poisoned one's record
    assert info["num_requests_dropped"] == 1 and "refused" in info["last_drop"]
    assert_store_matches(api, engine)
