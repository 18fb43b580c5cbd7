"""The event publisher against an honest in-test control plane: the store's mirror of the block
table equals the engine's after evictions, preemption, a pin, a restart, an overflow, a lost
store and msgpack; a refused token and an unreachable control plane never slow the engine."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from websockets.sync.server import Server, ServerConnection, serve

from cli.main import build_parser, main
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.wire import (
    CLOSE_BAD_FRAME,
    CLOSE_FUTURE_SEQ,
    CLOSE_UNAUTHORIZED,
    CLOSE_WRONG_ENGINE,
    Ack,
    Batch,
    Command,
    Hello,
    Snapshot,
    Welcome,
    WireError,
    decode,
    encode,
)
from publish.outbox import MAX_REJECTIONS
from publish.publisher import EventPublisher
from publish.publisher_link import Backoff, ingest_url
from tests.engine.conftest import tokens
from tests.engine.ledger_harness import Harness, Submission, sized_pools
from tests.polling import wait_until

TOKEN = "secret-token"
FAST = Backoff(initial_s=0.01, max_s=0.1, unauthorized_s=0.2)


def free_row(group: str, block_id: int) -> dict:
    return {
        "group": group,
        "block_id": block_id,
        "state": "free",
        "keys": [],
        "token_range": None,
        "is_partial": False,
        "checkpoint_reason": None,
        "ref_cnt": 0,
        "pinned": False,
        "last_change": 0,
    }


@dataclass
class Store:
    """One (engine, epoch)'s table as the control plane keeps it."""

    next_seq: int = 0
    blocks: dict[tuple[str, int], dict] = field(default_factory=dict)
    pins: dict[str, dict] = field(default_factory=dict)
    applied: list[int] = field(default_factory=list)  # seqs, in the order they were committed
    num_snapshots: int = 0

    def apply_batch(self, batch: Batch) -> None:
        for event in batch.events:
            if event.type == "BlockStateChanged":
                for row in event.blocks:
                    self.blocks[row.group, row.block_id] = json.loads(encode(row))
            elif event.type == "PinUpdated":
                self.pins[event.pin_id] = json.loads(encode(event))

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        self.blocks = {(r.group, r.block_id): json.loads(encode(r)) for r in snapshot.blocks}
        self.pins = {p.pin_id: json.loads(encode(p)) for p in snapshot.pins}
        self.num_snapshots += 1

    def rows(self) -> list[dict]:
        return [self.blocks[key] for key in sorted(self.blocks)]


class ControlPlane:
    """The ingest socket's server side, honestly: token, welcome with the kept next seq, batches
    applied in seq order (seen before: acked and skipped; from the future: 4422), snapshots."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.stores: dict[tuple[str, int], Store] = {}
        self.lock = threading.Lock()
        self.ack = True
        self.crash_next = False  # read the next frame, then die before committing it
        self.pongs_lost = 0  # sessions to close at their first frame as a keepalive timeout does
        self.commands: list[Command] = []  # sent after each welcome
        self.num_lost = 0
        self.frame_kinds: set[type] = set()
        self.close_codes: list[int] = []
        self.port = 0
        self.server: Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ControlPlane:
        self.server = serve(self.handle, "127.0.0.1", self.port)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.thread.join(5)
            self.server = None

    def store(self, engine: Engine) -> Store:
        return self.stores[engine.engine_id, engine.epoch]

    def refuse(self, ws: ServerConnection, code: int, reason: str) -> None:
        self.close_codes.append(code)
        ws.close(code, reason)

    def handle(self, ws: ServerConnection) -> None:
        assert ws.request.path == "/api/v1/ingest"
        if ws.request.headers.get("Authorization") != f"Bearer {self.token}":
            self.refuse(ws, CLOSE_UNAUTHORIZED, "missing or wrong token")
            return
        try:
            hello = decode(ws.recv(timeout=5))
            if not isinstance(hello, Hello):
                raise WireError(CLOSE_BAD_FRAME, "expected hello")
            with self.lock:
                store = self.stores.get((hello.engine_id, hello.epoch))
                if store is None:  # a new epoch: the table laid out from the geometry
                    store = self.stores[hello.engine_id, hello.epoch] = Store()
                    for group, shape in hello.geometry.groups.items():
                        for block_id in range(shape.num_blocks):
                            store.blocks[group, block_id] = free_row(group, block_id)
                welcome = Welcome(epoch=hello.epoch, next_seq=store.next_seq)
            ws.send(encode(welcome))
            for command in self.commands:
                ws.send(encode(command))
            for data in ws:
                frame = decode(data)
                self.frame_kinds.add(type(data))
                if self.pongs_lost:  # what websockets sends when our ping goes unanswered
                    self.pongs_lost -= 1
                    self.refuse(ws, 1011, "keepalive ping timeout")
                    return
                if self.crash_next:
                    self.crash_next = False
                    self.num_lost += 1
                    ws.close(1011, "crashed before commit")
                    return
                with self.lock:
                    self.receive(ws, hello, store, frame)
        except WireError as exc:
            self.refuse(ws, exc.code, exc.reason)

    def receive(self, ws: ServerConnection, hello: Hello, store: Store, frame) -> None:
        if not isinstance(frame, Batch | Snapshot):
            raise WireError(CLOSE_BAD_FRAME, f"unexpected {frame.type}")
        if frame.engine_id != hello.engine_id or frame.epoch != hello.epoch:
            raise WireError(CLOSE_WRONG_ENGINE, "a frame for another engine")
        if frame.seq < store.next_seq:
            pass  # seen before: acknowledged again, not applied
        elif isinstance(frame, Snapshot):
            store.apply_snapshot(frame)  # takes the seq after the batches it covers
            store.applied.append(frame.seq)
            store.next_seq = frame.seq + 1
        elif frame.seq > store.next_seq:
            raise WireError(CLOSE_FUTURE_SEQ, f"seq {frame.seq}, expected {store.next_seq}")
        else:
            store.apply_batch(frame)
            store.applied.append(frame.seq)
            store.next_seq += 1
        if self.ack:
            ws.send(encode(Ack(seq=store.next_seq - 1)))


@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    cp = ControlPlane().start()
    yield cp
    cp.stop()


def workload() -> list[Submission]:
    """Shared prefixes, multi-turn extensions and a pin, for pools that must evict and preempt."""
    system = tokens(1, 200)
    subs = [Submission(system, pin=True)]
    for i in range(24):
        base = system if i % 2 == 0 else tokens(1000 + i % 5, 150)
        subs.append(Submission(base + tokens(100 + i, 100 + 37 * (i % 7)), max_tokens=3))
        if i % 6 == 5:
            subs.append(Submission(tokens(300 + i, 40), max_tokens=2, extends_previous=True))
    return subs


def small_engine(engine_id: str = "engine-pub") -> Engine:
    config = CacheConfig(block_size=16, mamba_block_size=64, prefix_match_unit=16)
    config = sized_pools(config, workload(), slack=2)
    scheduler = SchedulerConfig(max_num_batched_tokens=128)
    return Engine(config, scheduler, runner="ledger", engine_id=engine_id)


def publisher(cp: ControlPlane, **kwargs) -> EventPublisher:
    return EventPublisher(cp.url, kwargs.pop("token", TOKEN), backoff=FAST, **kwargs)


def engine_rows(engine: Engine) -> list[dict]:
    table = json.loads(json.dumps(engine.snapshot()["blocks"]))
    return sorted(table, key=lambda row: (row["group"], row["block_id"]))


def assert_mirrors(cp: ControlPlane, engine: Engine) -> Store:
    store = cp.store(engine)
    assert store.rows() == engine_rows(engine)
    assert {p: row["state"] for p, row in store.pins.items()} == {
        p: pin.state.value for p, pin in engine.pins.items()
    }
    return store


def only(stores: dict[tuple[str, int], Store]) -> Store:
    (store,) = stores.values()
    return store


def more_requests(harness: Harness, seed: int, num: int = 4) -> None:
    harness.run([Submission(tokens(seed + i, 300), max_tokens=2) for i in range(num)])


# ---------------------------------------------------------------------------- tests
def test_ingest_url_maps_schemes_and_paths():
    assert ingest_url("http://cp:8080") == "ws://cp:8080/api/v1/ingest"
    assert ingest_url("https://cp/prefix/") == "wss://cp/prefix/api/v1/ingest"
    assert ingest_url("ws://cp:1/api/v1/ingest") == "ws://cp:1/api/v1/ingest"
    with pytest.raises(ValueError, match="http"):
        ingest_url("ftp://cp")
    with pytest.raises(ValueError, match="token"):
        EventPublisher("http://cp", "")


def test_mirror_equals_the_engine_after_evictions_preemption_and_a_pin(plane):
    engine = small_engine()
    received: list[Command] = []
    plane.commands = [Command(command="pin", payload={"pin_id": "p", "prompt": "hi"})]
    with publisher(plane, on_command=received.append) as pub:
        pub.attach(engine)
        requests = Harness(engine, concurrency=4).run(workload())
        assert pub.flush(10)
        stats = pub.stats()
    assert any(r.num_preemptions for r in requests), "the workload must preempt"
    assert [p.state.value for p in engine.pins.values()] == ["materialized"]
    store = assert_mirrors(plane, engine)
    assert any(row["state"] == "pinned" for row in store.rows())
    assert store.applied == list(range(len(store.applied))) and store.num_snapshots == 0
    assert stats.num_sent == stats.num_acked == len(store.applied) > 50
    assert (stats.num_resent, stats.num_dropped, stats.num_buffered) == (0, 0, 0)
    assert received == plane.commands
    assert plane.frame_kinds == {str}


def test_restart_mid_stream_resends_without_duplicates_or_gaps(plane):
    engine = small_engine()
    subs = workload()
    harness = Harness(engine, concurrency=4)
    with publisher(plane) as pub:
        pub.attach(engine)
        harness.run(subs[:8])
        assert pub.flush(10)
        plane.crash_next = True  # the next frame is read but never committed
        more_requests(harness, 500, 1)
        assert wait_until(lambda: plane.num_lost == 1)
        plane.stop()
        harness.run(subs[8:16])  # buffered while the control plane is down
        assert pub.stats().num_buffered > 0 and not pub.stats().is_connected
        plane.start()  # same port, same stores: the welcome says where to resume
        harness.run(subs[16:])
        assert pub.flush(10)
        stats = pub.stats()
    store = assert_mirrors(plane, engine)
    assert store.applied == list(range(len(store.applied)))  # each seq committed exactly once
    assert store.num_snapshots == 0
    assert stats.num_resent >= 1 and stats.num_connections >= 2 and stats.num_dropped == 0


def test_overflow_during_a_long_disconnect_sends_a_snapshot(plane):
    engine = small_engine()
    subs = workload()
    harness = Harness(engine, concurrency=4)
    with publisher(plane, max_batches=5) as pub:
        pub.attach(engine)
        harness.run(subs[:6])
        assert pub.flush(10)
        plane.stop()
        harness.run(subs[6:])
        before = pub.stats()  # a tiny buffer may overflow even while connected: count from here
        assert before.num_buffered <= 5 and before.num_dropped > 20
        plane.start()
        assert pub.flush(10)
        assert pub.stats().num_snapshots == before.num_snapshots + 1  # only the newest one
        assert_mirrors(plane, engine)
        more_requests(harness, 700)
        assert pub.flush(10)
        stats = pub.stats()
    store = assert_mirrors(plane, engine)
    # Every snapshot the store applied was sent; one sent may never be applied (its connection
    # closed first, or a newer one replaced it when the tiny buffer overflowed while connected).
    assert 1 <= store.num_snapshots <= stats.num_snapshots
    assert store.applied == sorted(set(store.applied))


def test_a_store_that_lost_the_stream_gets_a_snapshot(plane):
    engine = small_engine()
    harness = Harness(engine, concurrency=4)
    with publisher(plane, binary=True) as pub:
        pub.attach(engine)
        more_requests(harness, 800)
        assert pub.flush(10)
        plane.stop()
        plane.stores.clear()  # a fresh database: it wants seq 0, long since acknowledged
        plane.start()
        assert wait_until(lambda: pub.needs_snapshot)  # it wants seq 0: long since dropped
        assert pub.flush(10)  # the engine is idle: the flush builds the snapshot
        assert plane.store(engine).num_snapshots == 1
        assert_mirrors(plane, engine)
        more_requests(harness, 900)
        assert pub.flush(10)
    store = assert_mirrors(plane, engine)
    assert store.num_snapshots == 1 and store.applied[0] > 0
    assert plane.frame_kinds == {bytes}


def test_msgpack_frames_mirror_the_engine(plane):
    engine = small_engine()
    with publisher(plane, binary=True) as pub:
        pub.attach(engine)
        Harness(engine, concurrency=4).run(workload()[:10])
        assert pub.flush(10)
    assert_mirrors(plane, engine)
    assert plane.frame_kinds == {bytes}


def test_acks_are_cumulative_and_flush_waits_for_them(plane):
    engine = small_engine()
    harness = Harness(engine, concurrency=4)
    plane.ack = False
    with publisher(plane) as pub:
        pub.attach(engine)
        more_requests(harness, 1000)
        assert not pub.flush(0.3)
        assert pub.stats().num_buffered > 1 and pub.stats().num_acked == 0
        plane.ack = True
        more_requests(harness, 1100, 1)  # one ack covers every frame before it
        assert pub.flush(10)
    assert_mirrors(plane, engine)


def test_a_refused_token_is_reported_and_the_engine_keeps_running(plane):
    engine = small_engine()
    harness = Harness(engine, concurrency=4)
    with publisher(plane, token="wrong") as pub:
        pub.attach(engine)
        more_requests(harness, 1200)
        assert wait_until(lambda: plane.close_codes.count(CLOSE_UNAUTHORIZED) >= 2)
        stats = pub.stats()
        assert "refused the token" in stats.last_error and "4401" in stats.last_error
        assert not stats.is_connected and stats.num_sent == 0
        assert not pub.flush(0.2)
        plane.token = "wrong"  # the operator fixes it: the slow retries get through
        assert pub.flush(10)
    assert_mirrors(plane, engine)


def test_a_keepalive_timeout_refuses_no_frame(plane):
    """The control plane's keepalive ping unanswered ends the connection with 1011 "keepalive
    ping timeout": a lost line, not the store refusing the frame, so however often it happens
    at one seq no finished request is dropped (a 1011 the store sends for a frame it failed
    on still counts)."""
    engine = small_engine()
    harness = Harness(engine, concurrency=4)
    plane.pongs_lost = MAX_REJECTIONS + 1  # each time at the first frame: one seq, again and again
    with publisher(plane) as pub:
        pub.attach(engine)
        more_requests(harness, 1300)
        assert wait_until(lambda: plane.close_codes.count(1011) == MAX_REJECTIONS + 1, 20)
        assert pub.flush(10)
        stats = pub.stats()
        assert stats.num_requests_dropped == 0, stats.last_drop
        assert stats.num_connections == MAX_REJECTIONS + 2
        assert "lost" in stats.last_error and "keepalive ping timeout" in stats.last_error
    assert_mirrors(plane, engine)


def test_steps_never_wait_on_an_unreachable_control_plane():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers a handshake
    port = silent.getsockname()[1]
    try:

        def timed(engine: Engine) -> list[float]:
            durations = []
            for i in range(60):
                start = time.perf_counter()
                engine.add_request(tokens(2000 + i, 200), SamplingParams(max_tokens=1))
                engine.run_until_done()
                durations.append(time.perf_counter() - start)
            return durations

        baseline = timed(small_engine())
        engine = small_engine()
        pub = EventPublisher(f"http://127.0.0.1:{port}", TOKEN, open_timeout_s=30)
        pub.attach(engine)
        with_publisher = timed(engine)
        assert not pub.stats().is_connected and pub.stats().num_buffered >= 60
        pub.close(timeout_s=0.1)
    finally:
        silent.close()
    assert max(with_publisher) < 5  # no request waited on the 30 s handshake
    assert sum(with_publisher) < 4 * sum(baseline) + 1


def test_replay_streams_to_the_control_plane(plane, tmp_path, monkeypatch):
    monkeypatch.delenv("JUNCTION_API_TOKEN", raising=False)
    trace = tmp_path / "trace.jsonl"
    segments = [[{"seed": 1, "len": 300}, {"seed": i, "len": 100}] for i in range(12)]
    lines = [
        {"id": f"r{i}", "prompt": {"segments": s}, "max_tokens": 2} for i, s in enumerate(segments)
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    snapshot = tmp_path / "table.json"
    argv = [str(trace), "--runner", "ledger", "--num-blocks", "64", "--concurrency", "3"]
    argv += ["--mamba-block-size", "64", "--out", str(tmp_path / "out.jsonl"), "--quiet"]
    argv += ["--snapshot-out", str(snapshot), "--control-plane", plane.url, "--token", TOKEN]
    assert main(["replay", *argv]) == 0
    (store,) = plane.stores.values()
    table = json.loads(snapshot.read_text())["blocks"]
    assert store.rows() == sorted(table, key=lambda row: (row["group"], row["block_id"]))
    assert main(["replay", *argv[:-2]]) == 2  # --control-plane without a token


def test_replay_warns_when_the_control_plane_does_not_acknowledge(plane, tmp_path, capsys):
    plane.ack = False
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"id": "a", "prompt": "hello there", "max_tokens": 1}) + "\n")
    argv = ["replay", str(trace), "--runner", "ledger", "--out", str(tmp_path / "o.jsonl")]
    argv += ["--control-plane", plane.url, "--token", TOKEN, "--flush-timeout", "0.3"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "waiting up to 0.3s" in err and "were not acknowledged" in err


def test_serve_streams_and_snapshots_an_idle_engine_for_a_store_that_lost_it(plane, monkeypatch):
    import uvicorn
    from fastapi.testclient import TestClient

    from serve.cli import cmd_serve

    seen: dict[str, list] = {}

    def run(app, **_):  # uvicorn.run's stand-in: the app's lifespan, a request, the table
        with TestClient(app) as client:
            body = {"model": "m", "prompt": "hello hybrid world " * 20, "max_tokens": 4}
            assert client.post("/v1/completions", json=body).status_code == 200
            assert wait_until(lambda: plane.stores and only(plane.stores).applied)
            plane.stop()
            plane.stores.clear()  # a fresh store while the engine idles: only a snapshot helps
            plane.start()
            assert wait_until(lambda: plane.stores and only(plane.stores).num_snapshots)
            seen["live"] = client.get("/debug/blocks").json()["blocks"]

    monkeypatch.setattr(uvicorn, "run", run)
    argv = ["serve", "--runner", "ledger", "--model-name", "m", "--mamba-block-size", "64"]
    argv += ["--num-blocks", "128", "--num-mamba-blocks", "64", "--control-plane", plane.url]
    assert cmd_serve(build_parser().parse_args([*argv, "--token", TOKEN])) == 0
    (store,) = plane.stores.values()
    assert store.rows() == sorted(seen["live"], key=lambda row: (row["group"], row["block_id"]))
