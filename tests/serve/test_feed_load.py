"""The load the cache feed reports (issue 48, item 10): every delta's `load` is the engine's
at that step, `1 - free / total` for each pool (attention, then Mamba) and the scheduler's
queues, read over `WS /v1/cache/feed` of a live server while real requests run."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from websockets.sync.client import connect

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.feed import FeedDelta, FeedHello, FeedHub, FeedSink, FeedSnapshot, decode
from serve.app import create_app
from serve.async_engine import AsyncEngine
from tests.serve.conftest import MAX_MODEL_LEN, MODEL, LiveServer, text_prompt
from tests.uvicorn_thread import uvicorn_thread

TOKEN = "feed-token-0123456789"
NUM_REQUESTS = 6


@pytest.fixture
def fed_server() -> Iterator[tuple[LiveServer, Engine, dict]]:
    """A server with a feed, and what the pools held after each step that published a delta
    (keyed by the delta's seq), recorded by a step listener after the feed's."""
    hub = FeedHub()
    engine = Engine(
        CacheConfig(block_size=16, mamba_block_size=64, num_blocks=256, num_mamba_blocks=24),
        SchedulerConfig(max_num_batched_tokens=128, max_model_len=MAX_MODEL_LEN),
        sink=FeedSink(hub, keep_events=False),
        engine_id="fed",
    )
    hub.attach(engine, MODEL)
    truth: dict[int, tuple] = {}

    def record(engine: Engine) -> None:
        scheduler = engine.scheduler
        pools = scheduler.coordinator.pools
        usage = tuple(1 - pools[g].num_free / pools[g].num_blocks for g in ("attention", "mamba"))
        truth.setdefault(hub.seq, (len(scheduler.running), len(scheduler.waiting), *usage))

    engine.step_listeners.append(record)
    async_engine = AsyncEngine(engine)
    app = create_app(async_engine, MODEL, feed=hub, feed_token=TOKEN)
    with uvicorn_thread(app, lifespan="on") as url:
        yield LiveServer(url, async_engine), engine, truth


def test_each_deltas_load_is_the_pools_usage_at_its_step(fed_server) -> None:
    server, _, truth = fed_server
    url = server.base_url.replace("http://", "ws://") + "/v1/cache/feed"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with connect(url, additional_headers=auth, max_size=None) as socket:
        assert isinstance(decode(socket.recv(timeout=10)), FeedHello)
        assert isinstance(decode(socket.recv(timeout=10)), FeedSnapshot)
        client = server.client()

        def complete(seed: int) -> str:
            prompt = text_prompt(seed, 700)
            return client.completions.create(model=MODEL, prompt=prompt, max_tokens=24).id

        with ThreadPoolExecutor(NUM_REQUESTS) as pool:
            request_ids = set(pool.map(complete, range(NUM_REQUESTS)))
        deltas: list[FeedDelta] = []
        finished: set[str] = set()
        while not request_ids <= finished:
            frame = decode(socket.recv(timeout=10))
            if isinstance(frame, FeedDelta):
                deltas.append(frame)
                finished.update(f.request_id for f in frame.finished)
    assert len(deltas) > NUM_REQUESTS
    for delta in deltas:
        load = delta.load
        reported = (load.num_running, load.num_waiting, load.attention_usage, load.mamba_usage)
        assert reported == truth[delta.seq], delta.seq
    # the loads compared were not all alike: both pools in use, at different shares
    assert any(0 < d.load.attention_usage != d.load.mamba_usage > 0 for d in deltas)
    assert any(d.load.num_running > 0 for d in deltas)
