"""The ingest socket through starlette's TestClient: the protocol, and every bad input."""

from __future__ import annotations

import logging

import msgpack
import msgspec
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.websockets import WebSocketDisconnect

from api.fleet.registry import EngineNotConnected
from api.store.models import Block, Engine, EventBatch
from engine.wire import Command, encode
from tests.api import factories
from tests.api.conftest import TOKEN
from tests.polling import wait_until

INGEST = "/api/v1/ingest"


def connect(client: TestClient, token: str | None = TOKEN, query: str = ""):
    """The socket with `token` in the header (None: none), not the client's default one."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return TestClient(client.app).websocket_connect(INGEST + query, headers=headers)


def send(ws, frame: dict, binary: bool) -> None:
    if binary:
        ws.send_bytes(encode(frame, binary=True))
    else:
        ws.send_text(encode(frame))


def receive(ws, binary: bool) -> dict:
    return msgpack.unpackb(ws.receive_bytes()) if binary else ws.receive_json()


def close_of(ws) -> tuple[int, str]:
    with pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    return closed.value.code, closed.value.reason


def is_connected(session: Session, engine_id: str) -> bool:
    session.expire_all()
    return session.get(Engine, engine_id).connected


def stored(session: Session) -> tuple[int, int, int | None]:
    session.expire_all()
    num_batches = session.scalar(select(func.count()).select_from(EventBatch))
    num_blocks = session.scalar(select(func.count()).select_from(Block))
    return num_batches, num_blocks, session.scalar(select(Engine.next_seq))


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_hello_welcome_batches_acks(client, session, engine_run, events, binary: bool) -> None:
    frames = factories.batches(engine_run, events, size=32)
    with connect(client) as ws:
        send(ws, factories.hello(engine_run), binary)
        welcome = receive(ws, binary)
        assert welcome == {"type": "welcome", "epoch": engine_run.epoch, "next_seq": 0}
        assert session.get(Engine, engine_run.engine_id).connected
        for frame in frames:
            send(ws, frame, binary)
            assert receive(ws, binary) == {"type": "ack", "seq": frame["seq"]}
    num_batches, num_blocks, next_seq = stored(session)
    assert (num_batches, next_seq) == (len(frames), len(frames))
    assert num_blocks > 0
    factories.assert_same_table(factories.store_rows(session, engine_run.engine_id), engine_run)
    assert wait_until(lambda: not is_connected(session, engine_run.engine_id))
    metrics = client.get("/metrics").text
    assert f"junction_ingest_batches_total {float(len(frames))}" in metrics
    assert f"junction_ingest_events_total {float(len(events))}" in metrics
    assert "junction_connected_engines 0.0" in metrics
    assert "junction_ingest_latency_seconds_count" in metrics


def test_a_reconnect_resumes_at_next_seq(client, session, engine_run, events) -> None:
    frames = factories.batches(engine_run, events, size=32)
    half = len(frames) // 2
    with connect(client) as ws:
        ws.send_text(encode(factories.hello(engine_run)))
        ws.receive_json()
        for frame in frames[:half]:
            ws.send_text(encode(frame))
            ws.receive_json()
    with connect(client, query=f"?token={TOKEN}") as ws:  # the browser's way to the token
        ws.send_text(encode(factories.hello(engine_run)))
        assert ws.receive_json()["next_seq"] == half
        for frame in frames[half - 2 :]:  # two it had already: acknowledged, skipped
            ws.send_text(encode(frame))
            assert ws.receive_json() == {"type": "ack", "seq": frame["seq"]}
    assert stored(session)[0::2] == (len(frames), len(frames))
    factories.assert_same_table(factories.store_rows(session, engine_run.engine_id), engine_run)
    assert "junction_ingest_duplicate_batches_total 2.0" in client.get("/metrics").text


def test_snapshot_over_the_socket(client, session, engine_run, events) -> None:
    with connect(client) as ws:
        ws.send_bytes(encode(factories.hello(engine_run), binary=True))
        msgpack.unpackb(ws.receive_bytes())
        ws.send_bytes(encode(factories.snapshot(engine_run, seq=9), binary=True))
        assert msgpack.unpackb(ws.receive_bytes()) == {"type": "ack", "seq": 9}
    assert stored(session)[1:] == (len(engine_run.snapshot()["blocks"]), 10)
    assert factories.store_rows(session, engine_run.engine_id) == factories.engine_rows(engine_run)


def test_commands_go_down_the_engines_socket(client, engine_run) -> None:
    registry = client.app.state.junction.registry
    command = Command(command="pin", payload={"pin_id": "p", "prompt_token_ids": [1, 2, 3]})
    with connect(client) as ws:
        ws.send_bytes(encode(factories.hello(engine_run), binary=True))
        ws.receive_bytes()
        assert registry.engine_ids() == [engine_run.engine_id]
        ws.portal.call(registry.send_command, engine_run.engine_id, command)
        assert msgpack.unpackb(ws.receive_bytes()) == msgspec.to_builtins(command)
        with pytest.raises(EngineNotConnected, match="engine 'nobody' is not connected"):
            ws.portal.call(registry.send_command, "nobody", command)
    assert wait_until(lambda: registry.engine_ids() == [])


BAD_INPUTS = {
    # name: (token, opening ("hello": a good hello and batch 0 first), sends, code, reason)
    "missing token": (None, None, [], 4401, "missing bearer token"),
    "wrong token": ("nope", None, [], 4401, "wrong bearer token"),
    "first frame not hello": (TOKEN, None, ["batch0"], 4400, "first frame must be hello"),
    "not JSON": (TOKEN, "hello", ["{not json"], 4400, "frame is not valid JSON"),
    "not msgpack": (TOKEN, "hello", [b"\xc1\x00"], 4400, "frame is not valid msgpack"),
    "unknown event type": (TOKEN, "hello", ["mystery"], 4400, "invalid frame at"),
    "another engine": (TOKEN, "hello", ["stranger"], 4409, "batch for engine 'stranger'"),
    "seq from the future": (TOKEN, "hello", ["batch5"], 4422, "expected seq 1, got 5"),
    "oversized frame": (TOKEN, "hello", ["huge"], 1009, "exceeds 1048576"),
    "a second hello": (TOKEN, "hello", ["hello"], 4400, "a second hello on one connection"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_closes_with_code_and_reason(
    client, session, engine_run, events, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    token, opening, sends, code, reason = BAD_INPUTS[case]
    frames = factories.batches(engine_run, events)
    mystery = dict(frames[1], events=[{"type": "BlockExploded", "group": "attention"}])
    payloads = {
        "batch0": encode(frames[0]),
        "batch5": encode(frames[5]),
        "mystery": encode(mystery),
        "stranger": encode(dict(frames[1], engine_id="stranger")),
        "hello": encode(factories.hello(engine_run)),
        "huge": "x" * (1024 * 1024 + 1),
    }
    caplog.set_level(logging.INFO, logger="api")
    with connect(client, token) as ws:
        if opening == "hello":
            ws.send_text(payloads["hello"])
            ws.receive_json()
            ws.send_text(payloads["batch0"])
            assert ws.receive_json() == {"type": "ack", "seq": 0}
        before = stored(session)
        for item in sends:
            payload = payloads.get(item, item) if isinstance(item, str) else item
            if isinstance(payload, bytes):
                ws.send_bytes(payload)
            else:
                ws.send_text(payload)
        closed_code, closed_reason = close_of(ws)
    assert closed_code == code
    assert reason in closed_reason
    assert stored(session) == before  # nothing of the bad frame was kept
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(reason in message and str(code) in message for message in warnings), warnings
    if opening == "hello":
        assert any(engine_run.engine_id in message for message in warnings)
    metrics = client.get("/metrics").text
    assert f'junction_ingest_rejected_total{{code="{code}"}} 1.0' in metrics
