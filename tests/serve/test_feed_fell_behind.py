"""A cache feed reader that falls behind (issue 48, item 9): more than `MAX_PENDING_FRAMES`
(4096) deltas waiting for it, it is closed 1013 with its reason, never sent a partial stream
nor waited for, and a new connection starts again from a snapshot (docs/events.md, section 6).

The server's loop is held while the engine steps on (as a reader that stops reading holds its
relay once the socket buffers are full, without filling megabytes of them first), so the
deltas pile up for the reader deterministically."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close
from websockets.sync.client import ClientConnection, connect

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.feed import (
    CLOSE_FELL_BEHIND,
    MAX_PENDING_FRAMES,
    FeedHeartbeat,
    FeedHello,
    FeedHub,
    FeedSink,
    FeedSnapshot,
    decode,
)
from engine.request import SamplingParams
from serve.app import create_app
from serve.async_engine import AsyncEngine
from tests.polling import wait_until
from tests.serve.conftest import MAX_MODEL_LEN, MODEL
from tests.uvicorn_thread import uvicorn_thread

TOKEN = "feed-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# each prefill step of 16 tokens stores one block: a delta a step, 125 a request
NUM_REQUESTS, PROMPT_TOKENS = 36, 2000


class FedServer:
    def __init__(self, url: str, async_engine: AsyncEngine, loops: list) -> None:
        self.feed_url = url.replace("http://", "ws://") + "/v1/cache/feed"
        self.url, self.async_engine, self.loops = url, async_engine, loops

    def on_engine(self, fn):
        return self.async_engine.submit(fn).result(timeout=30)


def fed_engine() -> tuple[FeedHub, AsyncEngine]:
    """An engine of one-block steps whose feed hub keeps no events for a publisher."""
    hub = FeedHub()
    engine = Engine(
        CacheConfig(block_size=16, mamba_block_size=64, num_blocks=512),
        SchedulerConfig(max_num_batched_tokens=16, max_model_len=MAX_MODEL_LEN),
        sink=FeedSink(hub, keep_events=False),
        engine_id="fed",
    )
    hub.attach(engine, MODEL)
    async_engine = AsyncEngine(engine)
    return hub, async_engine


@pytest.fixture
def fed_server() -> Iterator[FedServer]:
    hub, async_engine = fed_engine()
    app = create_app(async_engine, MODEL, feed=hub, feed_token=TOKEN)
    loops: list[asyncio.AbstractEventLoop] = []

    async def running_loop() -> None:  # the test's way to the server's event loop
        loops.append(asyncio.get_running_loop())

    app.add_api_route("/test/loop", running_loop)
    with uvicorn_thread(app, lifespan="on") as url:
        server = FedServer(url, async_engine, loops)
        httpx.get(f"{url}/test/loop", timeout=10).raise_for_status()
        yield server


def add_requests(engine: Engine) -> None:
    rng = random.Random(0)
    for _ in range(NUM_REQUESTS):
        prompt = [rng.randrange(256) for _ in range(PROMPT_TOKENS)]
        engine.add_request(prompt, SamplingParams(max_tokens=1))


def read_until_closed(socket: ClientConnection, max_heartbeats: int = 20) -> Close:
    """The close frame that ends the feed; fails at any delta before it (dropped, not trimmed:
    none of the deltas it missed may reach it, so it cannot take a partial stream for the
    engine's keys) and when it goes on sending heartbeats."""
    try:
        for _ in range(max_heartbeats):
            frame = decode(socket.recv(timeout=10))
            assert isinstance(frame, FeedHeartbeat), f"the reader was sent {frame!r}"
    except ConnectionClosed as exc:
        assert exc.rcvd is not None, "closed without a close frame"
        return exc.rcvd
    pytest.fail("the reader that fell behind was never closed")


def test_a_reader_that_falls_behind_is_closed_1013_and_resyncs(fed_server: FedServer) -> None:
    with connect(fed_server.feed_url, additional_headers=AUTH, max_size=None) as slow:
        assert isinstance(decode(slow.recv(timeout=10)), FeedHello)
        first = decode(slow.recv(timeout=10))
        assert isinstance(first, FeedSnapshot)

        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait(60)

        fed_server.loops[0].call_soon_threadsafe(hold)
        try:
            assert held.wait(10)
            fed_server.on_engine(add_requests)  # the engine's own loop steps them
            assert wait_until(lambda: not fed_server.on_engine(Engine.has_unfinished), 60)
        finally:
            release.set()
        close = read_until_closed(slow)
    assert close.code == CLOSE_FELL_BEHIND == 1013
    assert "fell behind" in close.reason and "reconnect" in close.reason

    keys = fed_server.on_engine(
        lambda engine: set(engine.scheduler.coordinator.attention.pool.entries)
    )
    with connect(fed_server.feed_url, additional_headers=AUTH, max_size=None) as again:
        assert isinstance(decode(again.recv(timeout=10)), FeedHello)
        snapshot = decode(again.recv(timeout=10))
    assert isinstance(snapshot, FeedSnapshot)
    assert snapshot.seq > first.seq + MAX_PENDING_FRAMES
    assert set(snapshot.attention) == keys and keys
