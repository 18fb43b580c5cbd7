"""The ingest socket through a real uvicorn server and the `websockets` client."""

from __future__ import annotations

import json
import logging

import httpx
import msgpack
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from engine.wire import encode
from tests.api import factories
from tests.api.conftest import AUTH, TOKEN


def ingest(server: str, token: str = TOKEN):
    url = server.replace("http://", "ws://") + "/api/v1/ingest"
    return connect(url, additional_headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_stream_through_uvicorn(server: str, engine_run, events, binary: bool) -> None:
    frames = factories.batches(engine_run, events, size=24)
    decode = msgpack.unpackb if binary else json.loads
    with ingest(server) as ws:
        ws.send(encode(factories.hello(engine_run), binary))
        assert decode(ws.recv(timeout=10)) == {
            "type": "welcome",
            "epoch": engine_run.epoch,
            "next_seq": 0,
        }
        for frame in frames:  # the engine streams without waiting; acks follow in order
            ws.send(encode(frame, binary))
        acks = [decode(ws.recv(timeout=10)) for _ in frames]
    assert acks == [{"type": "ack", "seq": frame["seq"]} for frame in frames]
    blocks = httpx.get(
        f"{server}/api/v1/engines/{engine_run.engine_id}/blocks",
        params={"limit": 10_000},
        headers=AUTH,
    ).json()
    assert blocks["total"] == len(blocks["blocks"]) > 0
    factories.assert_same_table(factories.table(blocks["blocks"]), engine_run)


@pytest.mark.parametrize(
    ("token", "frame", "code", "reason"),
    [
        ("wrong", None, 4401, "wrong bearer token"),
        (TOKEN, "future", 4422, "expected seq 0, got 3"),
        (TOKEN, "huge", 1009, "frame of 1048577 bytes exceeds 1048576"),
    ],
    ids=["wrong token", "future seq", "oversized"],
)
def test_bad_input_through_uvicorn(
    server: str, engine_run, events, caplog, token: str, frame, code: int, reason: str
) -> None:
    caplog.set_level(logging.WARNING, logger="api")
    with ingest(server, token) as ws:
        if frame is not None:
            ws.send(encode(factories.hello(engine_run), binary=True))
            ws.recv(timeout=10)
            if frame == "future":
                ws.send(encode(factories.batches(engine_run, events)[3], binary=True))
            else:
                ws.send(b"\x00" * (1024 * 1024 + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (code, reason)
    assert any(reason in r.getMessage() for r in caplog.records)
    engines = httpx.get(f"{server}/api/v1/engines", headers=AUTH).json()
    if frame is not None:
        assert engines[0]["next_seq"] == 0
        events_page = httpx.get(f"{server}/api/v1/events", headers=AUTH).json()
        assert events_page["batches"] == []
