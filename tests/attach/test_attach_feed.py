"""`junction attach vllm --feed-port`, in its own process, against a peer in process that
publishes as vLLM's `ZmqEventPublisher` does: its `WS /v1/cache/feed` must speak the engine's
protocol (hello, snapshot, deltas, heartbeats; the bearer token, close 4401 without it), with
Junction's hashes of the tokens the peer stored as keys, and the hello naming the peer's own
server. No control plane: the feed alone is somewhere for the cache to go."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from engine.feed import (
    CLOSE_UNAUTHORIZED,
    FeedDelta,
    FeedHeartbeat,
    FeedHello,
    FeedSnapshot,
    decode,
)
from tests.api.processes import free_port
from tests.attach.bridge.test_feed_keys import TOKENS, key_at
from tests.attach.conftest import FakePeer, stored
from tests.polling import wait_until

TOKEN = "attach-feed-token-0123456789"
SERVE_URL = "http://127.0.0.1:8000"


class AttachProcess:
    """`junction attach vllm` over `peer`, serving a cache feed only (`http_url`: what
    `junction route --engine` takes)."""

    def __init__(
        self,
        peer: FakePeer,
        serve_url: str = SERVE_URL,
        token: str = TOKEN,
        model: str = "hybrid-model",
    ) -> None:
        self.port = free_port()
        self.token = token
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.url = f"ws://127.0.0.1:{self.port}/v1/cache/feed"
        self.log_file = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads fills up
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "attach", "vllm", "--events", peer.events_url]
            + ["--replay", peer.replay_url, "--engine-id", "vllm-a", "--token", token]
            + ["--metrics-port", "0", "--feed-port", str(self.port), "--serve-url", serve_url]
            + ["--served-model", model],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
            text=True,
        )

    def follow(self, token: str | None = None) -> ClientConnection:
        return connect(
            self.url,
            additional_headers={"Authorization": f"Bearer {token or self.token}"},
            proxy=None,
            open_timeout=5,
            ping_interval=None,
            max_size=None,
        )

    def log(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)
        self.log_file.seek(0)
        return self.log_file.read()


@pytest.fixture
def attach(peer: FakePeer) -> Iterator[AttachProcess]:
    # stored before the bridge starts: the replay (asked from seq 0) brings them
    peer.publish([stored([1, 2, 3, 4], tokens=TOKENS[0:16], block_size=4)])
    mamba = stored([101], tokens=TOKENS[0:16], block_size=8, group_idx=1, kind="mamba")
    peer.publish([mamba])  # vLLM's "align" mode: the last state of the step only
    process = AttachProcess(peer)
    yield process
    print(process.log())  # shown with a failure


def first_frames(attach: AttachProcess) -> tuple[FeedHello, FeedSnapshot] | None:
    """The hello and snapshot of a new connection once the feed holds Mamba states (before
    the replayed blocks are in, the first of them start a new epoch, closing the connection)."""
    try:
        with attach.follow() as socket:
            hello, snapshot = decode(socket.recv(5)), decode(socket.recv(5))
    except (OSError, ConnectionClosed, TimeoutError):
        return None
    return (hello, snapshot) if snapshot.mamba else None


def test_the_feed_serves_the_peers_blocks_as_junction_keys(peer, attach) -> None:
    found: list = []
    assert wait_until(lambda: found.append(first_frames(attach)) or found[-1], 60, 0.2), (
        attach.log()
    )
    hello, snapshot = found[-1]
    assert (hello.engine_id, hello.model, hello.serve_url) == ("vllm-a", "hybrid-model", SERVE_URL)
    assert not hello.reports_finished
    assert hello.geometry.attention_block_size == 4 and hello.geometry.hit_alignment == 8
    assert set(snapshot.attention) == {key_at(n) for n in (4, 8, 12, 16)}
    assert snapshot.mamba == [key_at(16)]
    with attach.follow() as socket:
        socket.recv(5), socket.recv(5)
        peer.wait_subscribed(30)
        peer.publish([stored([5, 6], parent=4, tokens=TOKENS[16:24], block_size=4)])
        frame = decode(socket.recv(10))
        while isinstance(frame, FeedHeartbeat):
            frame = decode(socket.recv(10))
    assert isinstance(frame, FeedDelta) and frame.seq == snapshot.seq + 1
    # one change: the peer has a Mamba group, so group 1 holds its states only
    (change,) = frame.changes
    assert (change.op, change.group, change.keys) == ("store", 0, [key_at(20), key_at(24)])


def test_the_feed_takes_the_attachs_token_only(attach) -> None:
    assert wait_until(lambda: first_frames(attach), 60, 0.2), attach.log()
    with attach.follow("wrong") as socket, pytest.raises(ConnectionClosed) as closed:
        socket.recv(5)
    assert closed.value.rcvd.code == CLOSE_UNAUTHORIZED
    with pytest.raises(InvalidStatus) as refused:
        connect(attach.url.replace("/v1/cache/feed", "/other"), proxy=None, open_timeout=5)
    assert refused.value.response.status_code == 404


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--feed-port", "1"], "--feed-port needs --serve-url"),
        (["--feed-port", "1", "--serve-url", "http://h:1/v1"], "without /v1"),
        (["--feed-port", "1", "--serve-url", "http://h:1"], "--served-model"),
        (
            [],
            "--control-plane (or JUNCTION_CONTROL_PLANE_URL), --feed-port or --recording-out "
            "is required",
        ),
    ],
)
def test_wrong_feed_options_exit_2_naming_the_option(options, message) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "attach", "vllm", "--events", "tcp://127.0.0.1:1"]
        + ["--token", TOKEN, "--metrics-port", "0", *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
