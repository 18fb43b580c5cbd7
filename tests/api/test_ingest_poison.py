"""Issue 15: what one engine (or anyone with the token) can send that must not stop the stream
or wipe the store. A stale-epoch hello is refused (4409) and changes nothing; a bad value is
refused at the edge (4400, naming the field and the seq), never a 1011; a frame that decodes
but that the store refuses is parked as a dead letter, acknowledged, readable through REST, and
the next frame is applied; only a database out of reach answers 1013."""

from __future__ import annotations

import json
import logging
import random
import string

import httpx
import msgpack
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from api.ingest.frames import Unstorable, is_refusal, transaction
from api.main import create_app
from api.store.models import Block, Engine, EventBatch, Request
from engine.events import INT64_MAX
from engine.wire import encode
from tests.api import factories
from tests.api.conftest import AUTH
from tests.api.processes import TOKEN as E2E_TOKEN
from tests.api.test_ingest_socket import close_of, connect
from tests.polling import wait_until

DEEP = 100_000


def table(session: Session) -> dict:
    """Everything a hello could wipe or rewrite: the engine row, its block rows, its requests."""
    session.expire_all()
    engine = session.scalars(select(Engine)).one()
    blocks = session.scalars(select(Block).order_by(Block.group, Block.block_id)).all()
    return {
        "engine": (engine.epoch, engine.next_seq, engine.geometry),
        "blocks": [(b.group, b.block_id, b.state, b.keys, b.last_change) for b in blocks],
        "requests": session.scalars(select(Request.request_id).order_by(Request.id)).all(),
        "batches": session.scalar(select(func.count()).select_from(EventBatch)),
    }


def stream(client: TestClient, engine_run, frames: list[dict], binary: bool = False) -> None:
    """Hello, then every frame, each acknowledged."""
    with connect(client) as ws:
        send = ws.send_bytes if binary else ws.send_text
        send(encode(factories.hello(engine_run), binary))
        receive(ws, binary)
        for frame in frames:
            send(encode(frame, binary))
            assert receive(ws, binary) == {"type": "ack", "seq": frame["seq"]}


def receive(ws, binary: bool) -> dict:
    return msgpack.unpackb(ws.receive_bytes()) if binary else ws.receive_json()


def finished(events: list[dict]) -> list[dict]:
    return [event for event in events if event["type"] == "RequestFinished"]


# ---------------------------------------------------------------------------- epochs
def test_a_stale_epoch_hello_is_refused_and_changes_nothing(
    client, session, engine_run, events
) -> None:
    frames = factories.batches(engine_run, events)
    stream(client, engine_run, frames)
    before = table(session)
    assert len(before["requests"]) == 8 and before["blocks"]
    stale = factories.hello(engine_run, epoch=engine_run.epoch - 1)
    with connect(client) as ws:
        ws.send_text(encode(stale | {"geometry": {"kind": "rewritten"}}))
        code, reason = close_of(ws)
    assert code == 4409
    assert f"epoch {engine_run.epoch - 1}" in reason and f"epoch {engine_run.epoch}" in reason
    assert table(session) == before  # no wipe, no new epoch, not even the geometry
    # the stored epoch resumes where it was; a newer one starts over, as before
    with connect(client) as ws:
        ws.send_text(encode(factories.hello(engine_run)))
        assert ws.receive_json()["next_seq"] == len(frames)
    assert table(session) == before
    with connect(client) as ws:
        ws.send_text(encode(factories.hello(engine_run, epoch=engine_run.epoch + 1)))
        assert ws.receive_json() == {
            "type": "welcome",
            "epoch": engine_run.epoch + 1,
            "next_seq": 0,
        }
    assert table(session)["blocks"] == []
    assert table(session)["requests"] == before["requests"]  # history stays


# ---------------------------------------------------------------------------- the edge
def _request(events: list[dict], **changes) -> dict:
    return finished(events)[0] | changes


def _mutate_json(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, (old, text.count(old))
    return text.replace(old, new)


def bad_frames(engine_run, events: list[dict]) -> dict[str, tuple[str | bytes, str]]:
    """name: (the payload after a good hello and batch 0, what the close reason names)."""
    batch = factories.batches(engine_run, events[:4], size=4)[0] | {"seq": 1}
    named = {"request_id": "poison-id", "finished_ts": 1_700_000_001.5}
    with_request = batch | {"events": [_request(events, **named)]}
    text = encode(with_request)
    packed = encode(with_request, binary=True)
    nan = float("nan")
    deep = "[" * DEEP + "]" * DEEP
    return {
        "10 KB request id": (
            encode(batch | {"events": [_request(events, request_id="r" * 10_240)]}),
            "events.0.request_id (seq 1)",
        ),
        "NUL in request_id": (
            encode(batch | {"events": [_request(events, request_id="a\x00b")]}),
            "events.0.request_id (seq 1)",
        ),
        "JSON nested 100k deep in events": (  # a typed field refuses the first level
            _mutate_json(text, '"chunks":[', f'"chunks":[{deep},'),
            "events.0.chunks.0.0 (seq 1)",
        ),
        "JSON nested 100k deep at the top": (deep, "invalid frame at top level"),
        "NaN in ts (JSON)": (_mutate_json(text, '"ts":1700000000.0', '"ts":"NaN"'), "ts (seq 1)"),
        "NaN in ts (msgpack)": (encode(with_request | {"ts": nan}, binary=True), "ts (seq 1)"),
        "NaN in finished_ts (JSON)": (
            _mutate_json(text, '"finished_ts":1700000001.5', '"finished_ts":"nan"'),
            "events.0.finished_ts (seq 1)",
        ),
        "NaN in finished_ts (msgpack)": (
            encode(batch | {"events": [_request(events, finished_ts=nan)]}, binary=True),
            "events.0.finished_ts (seq 1)",
        ),
        "infinite arrival_ts": (
            encode(batch | {"events": [_request(events, arrival_ts=float("inf"))]}, binary=True),
            "events.0.arrival_ts (seq 1)",
        ),
        "surrogate in request_id (JSON)": (
            _mutate_json(text, '"poison-id"', '"\\ud800"'),
            "not valid JSON",
        ),
        "surrogate in request_id (msgpack)": (
            packed.replace(msgpack.packb("poison-id"), b"\xa3\xed\xa0\x80"),
            "not valid msgpack (seq 1)",
        ),
        "NUL in engine_id": (encode(batch | {"engine_id": "engine\x00"}), "engine_id (seq 1)"),
        "integer beyond 64 bits": (
            _mutate_json(text, '"num_preemptions":0', f'"num_preemptions":{2**64}'),
            "events.0.num_preemptions (seq 1)",
        ),
    }


BAD_FRAMES = [
    "10 KB request id",
    "NUL in request_id",
    "JSON nested 100k deep in events",
    "JSON nested 100k deep at the top",
    "NaN in ts (JSON)",
    "NaN in ts (msgpack)",
    "NaN in finished_ts (JSON)",
    "NaN in finished_ts (msgpack)",
    "infinite arrival_ts",
    "surrogate in request_id (JSON)",
    "surrogate in request_id (msgpack)",
    "NUL in engine_id",
    "integer beyond 64 bits",
]


@pytest.mark.parametrize("case", BAD_FRAMES)
def test_a_bad_value_closes_4400_naming_the_field_and_seq(
    client, session, engine_run, events, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    payload, named = bad_frames(engine_run, events)[case]
    caplog.set_level(logging.WARNING, logger="api")
    stream(client, engine_run, factories.batches(engine_run, events[:4], size=4))
    before = table(session)
    with connect(client) as ws:
        ws.send_text(encode(factories.hello(engine_run)))
        assert ws.receive_json()["next_seq"] == 1
        (ws.send_bytes if isinstance(payload, bytes) else ws.send_text)(payload)
        code, reason = close_of(ws)
    assert (code, named in reason) == (4400, True), reason
    assert len(reason.encode()) <= 123
    assert table(session) == before
    assert client.get("/api/v1/engines/engine-test/dead-letters").json()["total"] == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no internal error


@pytest.mark.parametrize(
    ("hello", "named"),
    [
        ({"engine_id": "engine\x00"}, "invalid frame at engine_id"),
        ({"geometry": {"groups": {"mamba": json.loads("[" * 40 + "]" * 40)}}}, "geometry.groups"),
        ({"geometry": {"events": "a\x00"}}, "geometry.events: Expected `str` without NUL"),
        ({"geometry": {"deep": {}}}, "at geometry: Object contains unknown field `deep`"),
        ({"geometry": {"prefix_match_unit": 0}}, "geometry.prefix_match_unit: Expected `int` >= 1"),
        ({"model": {"deep": json.loads("[" * 40 + "]" * 40)}}, "model.deep"),
        ({"model": {"big": 2**70}}, "model.big: an integer over 64 bits"),
        ({"model": {"card": "x" * 70_000}}, "at model: 70011 bytes of JSON, at most 65536"),
    ],
    ids=[
        "NUL in engine_id",
        "geometry not its shape",
        "NUL in geometry",
        "unknown geometry field",
        "zero match unit",
        "model too deep",
        "big int in model",
        "model over 64 KiB",
    ],
)
def test_a_bad_hello_closes_4400(client, session, engine_run, hello: dict, named: str) -> None:
    with connect(client) as ws:
        ws.send_text(encode(factories.hello(engine_run) | hello))
        code, reason = close_of(ws)
    assert (code, named in reason) == (4400, True), reason
    assert session.scalar(select(func.count()).select_from(Engine)) == 0


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_a_hello_nested_100k_deep_closes_4400(client, session, engine_run, binary: bool) -> None:
    hello = factories.hello(engine_run) | {"model": {"deep": "here"}}
    if binary:  # a fixarray of one, 100k times, around an empty one
        packed = encode(hello, binary=True)
        deep = packed.replace(msgpack.packb("here"), b"\x91" * DEEP + b"\x90")
    else:
        deep = _mutate_json(encode(hello), '"here"', "[" * DEEP + "]" * DEEP)
    with connect(client) as ws:
        (ws.send_bytes if binary else ws.send_text)(deep)
        assert close_of(ws) == (4400, "frame nested too deep")
    assert session.scalar(select(func.count()).select_from(Engine)) == 0


# ---------------------------------------------------------------------------- dead letters
def unstorable(engine_run, events: list[dict], seq: int) -> dict:
    """A batch that passes the edge but that the store refuses: a finite `finished_ts` whose
    hit-rate bucket starts beyond what the bucket's 64-bit column holds."""
    poison = _request(events, request_id=f"poison-{seq}", finished_ts=1e300)
    return factories.batches(engine_run, [poison], size=1, first_seq=seq)[0]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_a_frame_the_store_refuses_is_parked_and_the_stream_goes_on(
    client, session, engine_run, events, binary: bool
) -> None:
    good = factories.batches(engine_run, finished(events), size=2)  # 4 batches of 2 requests
    frames = [good[0], unstorable(engine_run, events, 1)] + [
        frame | {"seq": frame["seq"] + 1} for frame in good[1:]
    ]
    stream(client, engine_run, frames, binary)  # every frame acked, the socket never closed
    session.expire_all()
    assert session.get(Engine, engine_run.engine_id).next_seq == len(frames)
    stored = set(session.scalars(select(Request.request_id)))
    assert stored == {event["request_id"] for event in finished(events)}  # all but the poison
    assert session.scalar(select(func.count()).select_from(EventBatch)) == len(frames) - 1
    page = client.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").json()
    assert (page["engine_id"], page["total"], len(page["dead_letters"])) == (
        engine_run.engine_id,
        1,
        1,
    )
    letter = page["dead_letters"][0]
    assert (letter["epoch"], letter["seq"], letter["frame_type"]) == (engine_run.epoch, 1, "batch")
    assert letter["reason"].startswith("the store cannot hold a value")
    assert json.loads(letter["frame"])["events"][0]["request_id"] == "poison-1"
    assert letter["frame_bytes"] == len(letter["frame"].encode())
    assert "junction_ingest_dead_letters_total 1.0" in client.get("/metrics").text
    # a read like any other: no token, no dead letters
    anonymous = TestClient(client.app)
    assert anonymous.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").status_code == 401
    assert client.get("/api/v1/engines/nobody/dead-letters").status_code == 404


def test_a_refused_batch_among_queued_ones_is_parked_alone(
    client, session, engine_run, events
) -> None:
    """Batches that queue up are committed together; one the store refuses among them is
    parked, and the ones before and after it are stored."""
    good = factories.batches(engine_run, finished(events), size=1)
    frames = [*good[:3], unstorable(engine_run, events, 3)] + [
        frame | {"seq": frame["seq"] + 1} for frame in good[3:]
    ]
    with connect(client) as ws:
        ws.send_text(encode(factories.hello(engine_run)))
        ws.receive_json()
        for frame in frames:  # all sent before any ack is read: they queue up
            ws.send_text(encode(frame))
        acks = [ws.receive_json() for _ in frames]
    assert acks == [{"type": "ack", "seq": frame["seq"]} for frame in frames]
    session.expire_all()
    assert len(session.scalars(select(Request)).all()) == len(good)
    letters = client.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").json()
    assert [letter["seq"] for letter in letters["dead_letters"]] == [3]


def test_an_engine_keeps_its_newest_dead_letters_each_bounded(
    settings, session, engine_run, events
) -> None:
    bounded = settings.model_copy(
        update={"dead_letters_per_engine": 2, "dead_letter_frame_bytes": 100}
    )
    with TestClient(create_app(bounded), headers=AUTH) as client:
        stream(client, engine_run, [unstorable(engine_run, events, seq) for seq in range(5)])
        page = client.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").json()
        assert page["total"] == 2
        assert [letter["seq"] for letter in page["dead_letters"]] == [4, 3]  # newest first
        assert all(len(letter["frame"].encode()) <= 100 for letter in page["dead_letters"])
        assert all(letter["frame_bytes"] > 100 for letter in page["dead_letters"])
        paged = client.get(
            f"/api/v1/engines/{engine_run.engine_id}/dead-letters", params={"offset": 1}
        ).json()
        assert [letter["seq"] for letter in paged["dead_letters"]] == [3]
        assert wait_until(lambda: not client.app.state.junction.registry.engine_ids())
        assert client.delete(f"/api/v1/engines/{engine_run.engine_id}").status_code == 204
    session.expire_all()
    assert session.get(Engine, engine_run.engine_id) is None


def test_a_refused_snapshot_is_parked(client, session, engine_run, events) -> None:
    finished_ts = {"requests": [{"seq": 0, "event": _request(events, finished_ts=1e300)}]}
    snapshot = factories.snapshot(engine_run, seq=0) | finished_ts
    frames = [snapshot, factories.batches(engine_run, events, first_seq=1)[0]]
    stream(client, engine_run, frames, binary=True)  # msgpack: the table fits in a frame
    letters = client.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").json()
    assert [(x["seq"], x["frame_type"]) for x in letters["dead_letters"]] == [(0, "snapshot")]
    session.expire_all()
    assert session.get(Engine, engine_run.engine_id).next_seq == 2


def test_a_snapshot_at_the_last_seq_is_parked_not_closed(client, session, engine_run) -> None:
    """seq 2^63 - 1 leaves no seq after it: the store could not hold `next_seq`, and parking
    it failed the same way, so the socket closed 4400 (issue 31)."""
    snapshot = factories.snapshot(engine_run, seq=INT64_MAX)
    stream(client, engine_run, [snapshot], binary=True)
    letters = client.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").json()
    [letter] = letters["dead_letters"]
    assert (letter["seq"], letter["frame_type"]) == (INT64_MAX, "snapshot")
    assert "no frame could follow it" in letter["reason"]
    session.expire_all()
    assert session.get(Engine, engine_run.engine_id).next_seq == INT64_MAX


def test_a_refused_frame_keeps_what_the_store_can_hold(client, session, engine_run, events):
    """One finished request the store cannot hold parks alone: the valid requests of its
    batch, and those a snapshot carries beside it, are stored (issue 31: they were parked with
    it)."""
    valid = finished(events)
    poison = _request(events, request_id="poison-b", finished_ts=1e300)
    batch = factories.batches(engine_run, [poison, *valid[:2]], size=3)[0]
    carried = [
        {"seq": 1, "event": _request(events, request_id="poison-s", finished_ts=-1e300)},
        {"seq": 1, "event": valid[2]},
    ]
    snapshot = factories.snapshot(engine_run, seq=1) | {"requests": carried}
    stream(client, engine_run, [batch, snapshot], binary=True)
    session.expire_all()
    stored = set(session.scalars(select(Request.request_id)))
    assert stored == {e["request_id"] for e in valid[:3]}
    assert session.get(Engine, engine_run.engine_id).next_seq == 2
    letters = client.get(f"/api/v1/engines/{engine_run.engine_id}/dead-letters").json()
    parked = {(x["seq"], x["frame_type"]): json.loads(x["frame"]) for x in letters["dead_letters"]}
    assert [e["request_id"] for e in parked[0, "batch"]["events"]] == ["poison-b"]
    assert [r["event"]["request_id"] for r in parked[1, "snapshot"]["requests"]] == ["poison-s"]
    assert "'poison-b': finished_ts 1e+300 is past what the store holds" in str(
        [x["reason"] for x in letters["dead_letters"]]
    )


# ---------------------------------------------------------------------------- what is poison
def test_the_index_limit_the_10kb_id_broke_is_a_refusal_not_an_outage(session, events) -> None:
    """PostgreSQL reports an index row over its limit (what a 10 KB request id broke) as an
    `OperationalError`, like a lost connection; the store takes it as the frame's fault."""
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("the btree's row limit is PostgreSQL's")
    session.add(Engine(engine_id="e", epoch=1, next_seq=0))
    session.commit()
    chars = random.Random(0).choices(string.ascii_letters + string.digits, k=10_240)
    event = finished(events)[0] | {"request_id": "".join(chars)}  # too random to compress
    del event["type"], event["unit_hashes"]  # the store keeps no raw unit hashes
    with pytest.raises(Unstorable, match="the store cannot hold a value: index row"):
        with transaction(session):
            session.add(Request(engine_id="e", epoch=1, **event))
    assert session.scalar(select(func.count()).select_from(Request)) == 0


class _Orig(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__("x")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("exc", "is_poison"),
    [
        (IntegrityError("insert", {}, _Orig("23505")), True),
        (OperationalError("insert", {}, _Orig("54000")), True),  # program limit exceeded
        (OperationalError("connect", {}, _Orig(None)), False),  # connection refused
        (OperationalError("insert", {}, _Orig("57P01")), False),  # admin shutdown
        (OverflowError("Python int too large to convert to SQLite INTEGER"), True),
        (RuntimeError("a bug"), False),
    ],
    ids=["unique", "index row", "refused", "shutdown", "sqlite overflow", "bug"],
)
def test_what_the_store_refuses_and_what_is_an_outage(exc: BaseException, is_poison: bool):
    assert is_refusal(exc) is is_poison


# ---------------------------------------------------------------------------- an outage
def test_a_database_outage_still_answers_1013_and_parks_nothing(proxied_api, engine_run, events):
    api, proxy = proxied_api
    url = api.url.replace("http://", "ws://") + "/api/v1/ingest"
    headers = {"Authorization": f"Bearer {E2E_TOKEN}"}
    frames = factories.batches(engine_run, events)
    with ws_connect(url, additional_headers=headers) as ws:
        ws.send(encode(factories.hello(engine_run)))
        ws.recv(timeout=10)
        ws.send(encode(frames[0]))
        assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": 0}
        proxy.cut()
        ws.send(encode(frames[1]))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1013
    assert closed.value.rcvd.reason == "store unavailable at seq 1, retry later"
    proxy.restore()
    with ws_connect(url, additional_headers=headers) as ws:  # the engine resends: applied now
        ws.send(encode(factories.hello(engine_run)))
        assert json.loads(ws.recv(timeout=30))["next_seq"] == 1
        ws.send(encode(frames[1]))
        assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": 1}
    letters = httpx.get(
        f"{api.url}/api/v1/engines/{engine_run.engine_id}/dead-letters", headers=headers, timeout=10
    )
    assert letters.json()["total"] == 0
