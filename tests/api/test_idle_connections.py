"""Idle sockets cannot keep requests out (`protocol.connections.waiting_room`,
`api.guards.idle_connections`): the issue's case over real sockets against `junction api` on
PostgreSQL, the bounds at accept on a uvicorn in this process, and the room against a model."""

from __future__ import annotations

import itertools
import random
import select
import socket
import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest

from api.guards.idle_connections import GuardedProtocol
from api.settings import get_settings
from protocol.connections.waiting_room import ALL_SETTING, PER_PEER_SETTING, WaitingRoom
from tests.api.conftest import Postgres, api_on_postgres
from tests.api.processes import AUTH, ApiProcess
from tests.polling import wait_until
from tests.uvicorn_thread import uvicorn_thread

MAX_CONNECTIONS, MAX_IDLE, MAX_IDLE_PER_IP = 64, 32, 16
HEALTH_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HOLD_REQUEST = b"GET /hold HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


# ---------------------------------------------------------------------------- the room
def test_the_room_pushes_out_a_peers_oldest_then_the_oldest_of_the_peer_holding_most() -> None:
    """Random enters and leaves against a model: each peer's connections oldest first, and
    when each peer last changed its count (the first to hold the most gives way first)."""
    rng = random.Random(7)
    room: WaitingRoom[int] = WaitingRoom(max_waiting=6, max_per_peer=3)
    model: dict[str, list[int]] = {peer: [] for peer in "abcd"}
    changed = dict.fromkeys("abcd", 0)  # when each peer's count last changed (a tick)
    ticks = itertools.count(1)

    def change(peer: str, connection: int, *, is_added: bool) -> None:
        if is_added:
            model[peer].append(connection)
        else:
            model[peer].remove(connection)
        changed[peer] = next(ticks)

    num_evicted = {PER_PEER_SETTING: 0, ALL_SETTING: 0}
    for connection in range(3000):
        waiting = [(peer, c) for peer, mine in model.items() for c in mine]
        if waiting and rng.random() < 0.3:
            peer, gone = rng.choice(waiting)
            change(peer, gone, is_added=False)
            room.leave(gone)
        peer = rng.choice("aaabcd")  # one peer floods
        evicted = room.enter(connection, peer)
        expected = []
        if len(model[peer]) >= 3:
            expected.append((model[peer][0], PER_PEER_SETTING))
            change(peer, model[peer][0], is_added=False)
        if sum(map(len, model.values())) >= 6:
            most = max(model, key=lambda p: (len(model[p]), -changed[p]))
            expected.append((model[most][0], ALL_SETTING))
            change(most, model[most][0], is_added=False)
        change(peer, connection, is_added=True)
        assert [(e.connection, e.setting) for e in evicted] == expected
        for _, setting in expected:
            num_evicted[setting] += 1
        room.check_invariants()
        assert len(room) == sum(map(len, model.values()))
    assert min(num_evicted.values()) > 100  # both bounds were exercised, often


def test_a_client_on_one_socket_outlasts_another_clients_flood() -> None:
    room: WaitingRoom[str] = WaitingRoom(max_waiting=4, max_per_peer=3)
    assert room.enter("mine", "10.0.0.1") == []
    for n in range(1000):
        evicted = room.enter(f"flood-{n}", f"10.0.0.{2 + n % 2}")
        assert "mine" not in [e.connection for e in evicted]
    assert "mine" in room and room.victim() != "mine"


# ---------------------------------------------------------------------------- a real server
@pytest.fixture
def idle_capped_api(postgres: Postgres, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiProcess]:
    """`junction api` on PostgreSQL with small bounds: the tests come from one IP."""
    monkeypatch.setenv("JUNCTION_MAX_CONNECTIONS", str(MAX_CONNECTIONS))
    monkeypatch.setenv("JUNCTION_MAX_IDLE_CONNECTIONS", str(MAX_IDLE))
    monkeypatch.setenv("JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP", str(MAX_IDLE_PER_IP))
    monkeypatch.setenv("JUNCTION_HEADER_TIMEOUT_S", "10")
    with api_on_postgres(postgres, "junction_idle") as process:
        yield process


class IdleFlood:
    """A thread holding `num_sockets` connections from `source_ip` that send nothing,
    reopening each one the server closes (the issue's client, which reopened them after each
    header timeout)."""

    def __init__(self, port: int, num_sockets: int, source_ip: str) -> None:
        self.port, self.num_sockets, self.source = port, num_sockets, (source_ip, 0)
        self.stopping = threading.Event()
        self.answers: list[bytes] = []  # what the server sent each socket it closed
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self.stopping.is_set():
                while len(held) < self.num_sockets:
                    address = ("127.0.0.1", self.port)
                    held.append(socket.create_connection(address, 5, self.source))
                closed, _, _ = select.select(held, [], [], 0.05)
                for sock in closed:
                    self.answers.append(drain(sock))
                    sock.close()
                    held.remove(sock)
                time.sleep(0.01)  # reopening at full speed would take the test's two cores
        finally:
            for sock in held:
                sock.close()


def drain(sock: socket.socket) -> bytes:
    """Everything the server sends on `sock` until it closes it."""
    sock.settimeout(5)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return received


def test_idle_sockets_reopened_without_end_do_not_keep_requests_out(
    idle_capped_api: ApiProcess,
) -> None:
    """The issue's case: two clients (127.0.0.2 and .3: Linux routes 127/8 to the loopback)
    hold three times JUNCTION_MAX_CONNECTIONS sockets that send nothing and reopen each one
    closed. Every authenticated read from 127.0.0.1 (a new connection each, and on one kept
    alive) and every /healthz answers 200; the idle sockets are what gives way."""
    floods = [
        IdleFlood(idle_capped_api.port, 3 * MAX_CONNECTIONS // 2, f"127.0.0.{n}") for n in (2, 3)
    ]
    for flood in floods:
        flood.thread.start()
    try:
        num_closed = lambda: sum(len(flood.answers) for flood in floods)  # noqa: E731
        assert wait_until(lambda: num_closed() >= MAX_CONNECTIONS, 60), "no flood reached a bound"
        statuses = []
        for _ in range(20):  # a new connection each
            engines = httpx.get(f"{idle_capped_api.url}/api/v1/engines", headers=AUTH, timeout=10)
            statuses.append(engines.status_code)
            statuses.append(httpx.get(f"{idle_capped_api.url}/healthz", timeout=10).status_code)
        with httpx.Client(base_url=idle_capped_api.url, headers=AUTH, timeout=10) as kept:
            statuses += [kept.get("/api/v1/engines").status_code for _ in range(10)]
    finally:
        for flood in floods:
            flood.stopping.set()
            flood.thread.join(30)
    assert statuses == [200] * 50
    answers = [answer for flood in floods for answer in flood.answers]
    assert len(answers) > 3 * MAX_CONNECTIONS  # they went on reopening throughout
    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in answers), answers[:3]
    assert any(PER_PEER_SETTING.encode() in answer for answer in answers)


def test_a_client_keeps_only_its_newest_idle_connections(idle_capped_api: ApiProcess) -> None:
    """40 idle sockets, then a request on a 41st: the oldest 25 were answered 503 naming
    JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP and closed, the newest 15 (with the request's, the
    cap of 16) are still open; the request was answered."""
    idle = [socket.create_connection(("127.0.0.1", idle_capped_api.port)) for _ in range(40)]
    try:
        with socket.create_connection(("127.0.0.1", idle_capped_api.port), timeout=5) as sock:
            sock.sendall(HEALTH_REQUEST)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        num_closed = 40 + 1 - MAX_IDLE_PER_IP
        for sock in idle[:num_closed]:
            answer = drain(sock)
            assert answer.startswith(b"HTTP/1.1 503 ") and PER_PEER_SETTING.encode() in answer
        for sock in idle[num_closed:]:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # open, nothing sent
                sock.recv(1)
    finally:
        for sock in idle:
            sock.close()


# ---------------------------------------------------------------------------- at accept
class Holding:
    """An ASGI app whose `/hold` answers once `release` is set, and `/` at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.num_holding = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/hold":
            self.num_holding += 1
            while not self.release.is_set():
                await anyio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def four_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, Holding]]:
    """A uvicorn in this process serving `Holding` with `GuardedProtocol`, at most 4
    connections; its port."""
    monkeypatch.setenv("JUNCTION_MAX_CONNECTIONS", "4")
    get_settings.cache_clear()
    app = Holding()
    try:
        with uvicorn_thread(app, http=GuardedProtocol) as url:
            yield int(url.rsplit(":", 1)[1]), app
    finally:
        app.release.set()
        get_settings.cache_clear()


def test_a_new_connection_takes_an_idle_ones_place_and_only_busy_ones_refuse_it(
    four_connections: tuple[int, Holding],
) -> None:
    """Three requests in progress and an idle socket: a fifth connection closes the idle one
    and is served; four requests in progress: a new connection is answered 503 at once."""
    port, app = four_connections
    address = ("127.0.0.1", port)
    held = [socket.create_connection(address, timeout=10) for _ in range(3)]
    for sock in held:
        sock.sendall(HOLD_REQUEST)
    assert wait_until(lambda: app.num_holding == 3)
    idle = socket.create_connection(address, timeout=10)  # accepted before the next one
    with socket.create_connection(address, timeout=10) as sock:  # the fifth: room is made
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert drain(sock).startswith(b"HTTP/1.1 200 ")
    answer = drain(idle)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"JUNCTION_MAX_CONNECTIONS" in answer
    held.append(socket.create_connection(address, timeout=10))
    held[-1].sendall(HOLD_REQUEST)
    assert wait_until(lambda: app.num_holding == 4)
    with socket.create_connection(address, timeout=10) as sock:  # all four busy: refused
        answer = drain(sock)
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"in progress (JUNCTION_MAX_CONNECTIONS)" in answer
    app.release.set()
    for sock in held:
        assert drain(sock).startswith(b"HTTP/1.1 200 ")
        sock.close()
