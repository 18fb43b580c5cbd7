"""A flood of idle sockets from the legitimate client's own IP (issue 47, item 6): a client on
127.0.0.1 reopening idle sockets as fast as the server closes them, beside REST calls and
engine hellos from the same 127.0.0.1. Before, the per-IP bound pushed out the oldest waiting
connection of the IP, and in a burst of accepts that was the legitimate one, whose request
sat unread in its socket: every REST call and every hello was answered 503. Now a connection
whose bytes wait unread is never the one closed (`protocol.connections.guarded`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect

from engine.wire import Hello, encode
from tests.api.conftest import Postgres, api_on_postgres
from tests.api.processes import AUTH, ApiProcess
from tests.api.test_idle_connections import PER_PEER_SETTING, IdleFlood
from tests.polling import wait_until

MAX_IDLE_PER_IP = 16
NUM_CALLS = 32


@pytest.fixture
def one_ip_api(postgres: Postgres, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiProcess]:
    monkeypatch.setenv("JUNCTION_MAX_CONNECTIONS", "256")
    monkeypatch.setenv("JUNCTION_MAX_IDLE_CONNECTIONS", "128")
    monkeypatch.setenv("JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP", str(MAX_IDLE_PER_IP))
    with api_on_postgres(postgres, "junction_one_ip") as process:
        yield process


def hello_is_welcomed(api: ApiProcess, n: int) -> bool:
    url = api.url.replace("http://", "ws://") + "/api/v1/ingest"
    with connect(url, additional_headers=AUTH, open_timeout=10) as ws:
        ws.send(encode(Hello(engine_id=f"engine-{n}", epoch=1, instance_id=f"i{n}")))
        return "welcome" in str(ws.recv(timeout=10))


def test_rest_calls_and_hellos_get_in_through_a_flood_from_their_own_ip(
    one_ip_api: ApiProcess,
) -> None:
    flood = IdleFlood(one_ip_api.port, 8 * MAX_IDLE_PER_IP, "127.0.0.1")
    flood.thread.start()
    statuses: list[int | str] = []
    welcomed = 0
    try:
        assert wait_until(lambda: len(flood.answers) >= 4 * MAX_IDLE_PER_IP, 30), "no flood"
        for n in range(NUM_CALLS):
            try:
                response = httpx.get(f"{one_ip_api.url}/api/v1/engines", headers=AUTH, timeout=10)
                statuses.append(response.status_code)
            except httpx.HTTPError as exc:
                statuses.append(repr(exc))
            if n % 4 == 0:
                try:
                    welcomed += hello_is_welcomed(one_ip_api, n)
                except Exception:  # noqa: BLE001 - counted: a hello refused or cut
                    pass
        num_reopened = len(flood.answers)
        time.sleep(0.2)
    finally:
        flood.stopping.set()
        flood.thread.join(30)
    assert statuses == [200] * NUM_CALLS, statuses
    assert welcomed == NUM_CALLS // 4
    assert num_reopened > 8 * MAX_IDLE_PER_IP  # the flood went on throughout
    assert any(PER_PEER_SETTING.encode() in answer for answer in flood.answers)
