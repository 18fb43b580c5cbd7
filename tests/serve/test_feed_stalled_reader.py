"""A cache feed reader that connects, takes the handshake and never reads (issue 47, item 9):
its TCP window fills, the server's send to it blocks (the hub's queue bound never sees it: the
relay holds no frames, it is stuck in one send), and it was never closed. A send that cannot
finish in `feed_send_timeout_s` drops the connection, and the engine serves its requests
meanwhile: its step never waits on a reader."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from engine.engine import Engine
from engine.feed import FeedHub
from engine.request import SamplingParams
from serve.app import create_app
from serve.async_engine import AsyncEngine
from serve.send_timeout import DEFAULT_FEED_SEND_TIMEOUT_S
from tests.polling import wait_until
from tests.serve.conftest import MODEL
from tests.serve.test_feed_fell_behind import fed_engine

TOKEN = "feed-token-0123456789"
SEND_TIMEOUT_S = 1.0
NUM_REQUESTS, PROMPT_TOKENS = 20, 2000  # a delta a 16-token step: 2,500, under the hub's 4,096
TCP_ESTABLISHED = 1


@pytest.fixture
def fed() -> Iterator[tuple[str, AsyncEngine, FeedHub]]:
    hub, async_engine = fed_engine()
    app = create_app(
        async_engine, MODEL, feed=hub, feed_token=TOKEN, feed_send_timeout_s=SEND_TIMEOUT_S
    )
    # the server's socket buffers small (accepted sockets inherit them), so that a few
    # hundred deltas fill what a real engine's megabytes would take minutes to
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, 10)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", async_engine, hub
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def stalled_reader(url: str) -> socket.socket:
    """A feed connection that does the handshake and then never reads: a tiny receive buffer,
    so the server's sends block after a few kilobytes."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        (
            "GET /v1/cache/feed HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n"
        ).encode()
    )
    head = b""
    while not head.endswith(b"\r\n\r\n"):  # the 101 and its headers, not a byte more
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def tcp_state(sock: socket.socket) -> int:
    """The kernel's state of the connection (`tcpi_state`): 1 while established; the server's
    reset makes it 7 (closed), its FIN 8 (close wait), unread data or not."""
    return struct.unpack("B", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1))[0]


def add_requests(engine: Engine) -> None:
    rng = random.Random(0)
    for _ in range(NUM_REQUESTS):
        prompt = [rng.randrange(256) for _ in range(PROMPT_TOKENS)]
        engine.add_request(prompt, SamplingParams(max_tokens=1))


def test_a_reader_that_never_reads_is_dropped_and_the_engine_serves_on(fed) -> None:
    url, async_engine, hub = fed
    sock = stalled_reader(url)
    try:
        assert wait_until(lambda: len(hub.subscribers) == 1, 10)
        start = time.monotonic()
        async_engine.submit(add_requests).result(timeout=30)
        assert wait_until(
            lambda: not async_engine.submit(Engine.has_unfinished).result(timeout=30), 60
        ), "the engine did not serve its requests beside a stalled reader"
        served_s = time.monotonic() - start
        # dropped within a bound of the engine's last delta (generous: a loaded machine)
        assert wait_until(lambda: tcp_state(sock) != TCP_ESTABLISHED, SEND_TIMEOUT_S + 10), (
            f"the stalled reader is still connected {served_s:.1f} s after it stopped reading"
        )
        assert wait_until(lambda: not hub.subscribers, 10)
    finally:
        sock.close()


def test_the_send_timeout_is_a_setting(monkeypatch, capsys) -> None:
    from tests.serve.test_cli import parse

    assert parse(["serve"]).feed_send_timeout == DEFAULT_FEED_SEND_TIMEOUT_S
    assert parse(["serve", "--feed-send-timeout", "2.5"]).feed_send_timeout == 2.5
    monkeypatch.setenv("JUNCTION_FEED_SEND_TIMEOUT_S", "0")
    with pytest.raises(SystemExit):
        parse(["serve"])
    assert "JUNCTION_FEED_SEND_TIMEOUT_S" in capsys.readouterr().err
