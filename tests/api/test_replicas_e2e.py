"""Replicas end to end over real processes: three `junction api` replicas on one PostgreSQL
database behind HAProxy (Debian's package, the balancer compose runs), six `junction serve`
ledger engines streaming through it.

1. The engines spread over the replicas, and `GET /engines` from every replica says all six
   are connected, each naming the replica that holds it.
2. A pin posted to the balancer materializes on every engine, whichever replica holds each:
   the replica that took the POST sends its own engines the command and notifies the others.
3. One replica is killed with -9 mid-stream: its engines reconnect through the balancer to
   the others, every replica's `GET /engines` again says all six are connected (none on the
   dead replica), and each engine's table in the store equals the engine's own.
4. The newest hello wins across replicas: a second socket of an engine, opened on another
   replica, makes the replica that held the first close it (4410).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from engine.wire import CLOSE_SUPERSEDED, Hello, Welcome, decode, encode
from stack.balancer import Balancer
from tests.api.conftest import Postgres
from tests.api.processes import AUTH, TOKEN, ApiProcess, Serve, free_port, pin_state
from tests.polling import wait_for
from tests.serve.conftest import text_prompt

NUM_REPLICAS, NUM_ENGINES = 3, 6
# beats twice as often as by default; the timeout is the default's (a loaded machine may hold
# up a beat for seconds while six engines start)
FAST_HEARTBEATS = {"JUNCTION_REPLICA_HEARTBEAT_S": "0.5", "JUNCTION_REPLICA_TIMEOUT_S": "5"}
SYSTEM = ("You are the Junction replica test. Answer briefly. " * 12)[:576]


@dataclass
class Fleet:
    replicas: list[ApiProcess]
    balancer: Balancer

    @property
    def url(self) -> str:  # what `Serve` connects its engine to, and the REST calls go to
        return self.balancer.url

    def engines_seen_by(self, replica: ApiProcess) -> dict[str, dict]:
        listed = httpx.get(f"{replica.url}/api/v1/engines", headers=AUTH, timeout=10)
        assert listed.status_code == 200, listed.text
        return {engine["engine_id"]: engine for engine in listed.json()}

    def alive(self) -> list[ApiProcess]:
        return [r for r in self.replicas if r.process is not None and r.process.poll() is None]


@pytest.fixture
def fleet(postgres: Postgres, postgres_template: str) -> Iterator[Fleet]:
    name = postgres.create("junction_fleet", template=postgres_template)
    replicas = [
        ApiProcess(postgres.url(name), free_port(), env=FAST_HEARTBEATS)
        for _ in range(NUM_REPLICAS)
    ]
    balancer = Balancer([f"127.0.0.1:{r.port}" for r in replicas], free_port())
    try:
        for replica in replicas:
            replica.start()
        with balancer:
            yield Fleet(replicas, balancer)
    finally:
        for replica in replicas:
            replica.kill()
        postgres.drop(name)


@pytest.fixture
def engines(fleet: Fleet) -> Iterator[list[Serve]]:
    """Six `junction serve` ledger engines, started side by side (each waits until its engine
    is connected through the balancer)."""
    with ThreadPoolExecutor(NUM_ENGINES) as pool:
        starting = [
            pool.submit(Serve, fleet, f"fleet-{index}", runner="ledger", start_timeout_s=240)
            for index in range(NUM_ENGINES)
        ]
    started = [future.result() for future in starting if future.exception() is None]
    try:
        for future in starting:
            future.result()  # raises the first start that failed
        yield started
    finally:
        for serve in started:
            serve.stop()


def holders(fleet: Fleet) -> dict[str, str | None]:
    """Each engine's replica, as the first live replica reads it."""
    seen = fleet.engines_seen_by(fleet.alive()[0])
    return {engine_id: engine["replica_id"] for engine_id, engine in seen.items()}


def live_replica_ids(fleet: Fleet) -> set[str]:
    """The replicas the first live one lists (`GET /replicas`)."""
    replica = fleet.alive()[0]
    listed = httpx.get(f"{replica.url}/api/v1/replicas", headers=AUTH, timeout=10).json()
    return {r["replica_id"] for r in listed}


def replica_id_of(fleet: Fleet, process: ApiProcess) -> str:
    listed = httpx.get(f"{process.url}/api/v1/replicas", headers=AUTH, timeout=10).json()
    return next(r["replica_id"] for r in listed if r["is_self"])


def all_connected_everywhere(fleet: Fleet, engine_ids: list[str], live: set[str]) -> bool:
    """Every live replica's `GET /engines` says each engine is connected, to one of `live`."""
    for replica in fleet.alive():
        seen = fleet.engines_seen_by(replica)
        for engine_id in engine_ids:
            engine = seen.get(engine_id, {})
            if not engine.get("connected") or engine.get("replica_id") not in live:
                return False
    return True


def num_requests(fleet: Fleet, engine_id: str) -> int:
    shown = httpx.get(f"{fleet.url}/api/v1/engines/{engine_id}", headers=AUTH, timeout=10)
    return shown.json()["num_requests"] if shown.status_code == 200 else 0


def store_equals_engine(fleet: Fleet, serve: Serve) -> bool:
    mine = httpx.get(f"{serve.url}/debug/blocks", timeout=10).json()["blocks"]
    return fleet.alive()[0].blocks(serve.engine_id) == mine


def test_three_replicas_behind_a_balancer_serve_six_engines_through_a_kill(
    fleet: Fleet, engines: list[Serve]
) -> None:
    engine_ids = [serve.engine_id for serve in engines]
    ids = {replica_id_of(fleet, r): r for r in fleet.replicas}
    assert live_replica_ids(fleet) == set(ids)
    wait_for(
        "every replica to see all six engines connected",
        lambda: all_connected_everywhere(fleet, engine_ids, set(ids)),
    )
    spread = Counter(holders(fleet)[e] for e in engine_ids)
    assert len(spread) >= 2, spread  # leastconn spread them over the replicas

    created = httpx.post(
        f"{fleet.url}/api/v1/pins",
        headers=AUTH,
        json={"prefix": {"text": SYSTEM}, "label": "fleet system prompt"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    pin_id = created.json()["pin_id"]
    for engine_id in engine_ids:
        wait_for(
            f"the pin to materialize on {engine_id}",
            lambda e=engine_id: pin_state(fleet, pin_id, e) == "materialized",
        )

    # mid-stream: every engine is serving requests when the busiest replica is killed
    stop = threading.Event()
    failures: list[BaseException] = []

    def stream(serve: Serve, seed: int) -> None:
        try:
            for i in range(400):
                if stop.is_set() and i >= 12:
                    return
                serve.ask(SYSTEM + text_prompt(seed * 1000 + i, 200))
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=stream, args=(s, n)) for n, s in enumerate(engines)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            "traffic on every engine", lambda: all(num_requests(fleet, e) >= 3 for e in engine_ids)
        )
        victim_id, num_held = spread.most_common(1)[0]
        ids[victim_id].kill()
        survivors = set(ids) - {victim_id}
        wait_for("the killed replica to be reaped", lambda: live_replica_ids(fleet) == survivors)
        wait_for(
            "the killed replica's engines to reconnect to the others",
            lambda: all_connected_everywhere(fleet, engine_ids, survivors),
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert not failures, failures
    assert num_held >= 1
    for serve in engines:
        wait_for(
            f"the store to equal {serve.engine_id}'s table",
            lambda s=serve: store_equals_engine(fleet, s),
        )
    for replica in fleet.alive():  # the same answer from every replica
        assert set(fleet.engines_seen_by(replica)) >= set(engine_ids)


def test_the_newest_hello_wins_across_replicas(fleet: Fleet) -> None:
    """A socket on the first replica, then one on the second: the first replica closes its
    older one (4410), and the engine stays connected; a third on the second replica closes
    the second's (the same rule on one replica). The last socket's goodbye disconnects it."""
    first, second = fleet.replicas[0], fleet.replicas[1]
    hello = Hello(engine_id="twice", epoch=7, geometry={}, model={"name": "ledger"})

    @contextmanager
    def socket_on(replica: ApiProcess) -> Iterator[ClientConnection]:
        with connect(
            f"ws://127.0.0.1:{replica.port}/api/v1/ingest",
            additional_headers={"Authorization": f"Bearer {TOKEN}"},
        ) as ws:
            ws.send(encode(hello))
            assert isinstance(decode(ws.recv(10)), Welcome)
            yield ws

    def closed_as_superseded(ws: ClientConnection) -> None:
        with pytest.raises(ConnectionClosed):  # its replica closes the older socket
            while True:
                ws.recv(10)
        assert ws.close_code == CLOSE_SUPERSEDED, (ws.close_code, ws.close_reason)

    with socket_on(first) as old:
        assert fleet.engines_seen_by(second)["twice"]["replica_id"] == replica_id_of(fleet, first)
        with socket_on(second) as newer:
            closed_as_superseded(old)
            engine = fleet.engines_seen_by(first)["twice"]
            assert engine["connected"]  # the older socket's goodbye did not clear the newer's
            assert engine["replica_id"] == replica_id_of(fleet, second)
            with socket_on(second) as newest:
                closed_as_superseded(newer)
                assert fleet.engines_seen_by(first)["twice"]["connected"]
                newest.close()
            wait_for(
                "the last socket's goodbye",
                lambda: not fleet.engines_seen_by(first)["twice"]["connected"],
            )
