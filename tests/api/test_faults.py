"""Faults over real processes: the store's database unreachable for a while, and an engine
restarted. (The API killed mid-stream is `test_stream_e2e.py`; a Celery worker killed mid-run
is `tests/jobs`.)

1. PostgreSQL cut off behind a TCP proxy: REST reads and writes answer 503 with the reason,
   the ingest socket closes with 1013 and rolls back, the engine keeps serving and buffers its
   events, and once the database is back the store catches up to the engine's table, each
   batch applied once.
2. A partition that holds PostgreSQL's connections open and answers nothing: REST answers 503
   within the statement bound instead of hanging, and recovers once the network does.
3. The engine killed and started again under the same id: a new epoch, the old epoch's blocks
   cleared from the store, and the pin made for it materialized again in the new engine.
"""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from benchmarks.tcp_proxy import TcpProxy
from tests.api.processes import TOKEN, ApiProcess, Serve, api_engine, free_port, pin_state
from tests.polling import wait_for
from tests.serve.conftest import text_prompt

AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEDGER = (
    *("--block-size", "16", "--mamba-block-size", "64", "--prefix-match-unit", "16"),
    *("--num-blocks", "400", "--num-mamba-blocks", "64", "--junction-checkpoints"),
)
SYSTEM = text_prompt(7, 300)


def store_requests(api: ApiProcess, engine_id: str) -> int:
    response = httpx.get(f"{api.url}/api/v1/engines/{engine_id}/requests", headers=AUTH, timeout=5)
    return response.json()["total"] if response.status_code == 200 else -1


def engine_blocks(serve: Serve) -> list[dict]:
    return httpx.get(f"{serve.url}/debug/blocks", timeout=10).json()["blocks"]


def touched(rows: list[dict]) -> list[dict]:
    """The rows of blocks some event has touched: a block never used is not in the store until
    a snapshot lists it, and is free either way."""
    return [row for row in rows if row["last_change"] or row["state"] != "free"]


def store_matches_engine(api: ApiProcess, serve: Serve) -> bool:
    try:
        return touched(api.blocks(serve.engine_id)) == touched(engine_blocks(serve))
    except (httpx.HTTPError, KeyError, ValueError):
        return False


def batch_seqs(api: ApiProcess, engine_id: str) -> list[tuple[int, int]]:
    seqs, after = [], -1
    while True:
        page = httpx.get(
            f"{api.url}/api/v1/events",
            params={"engine_id": engine_id, "after_seq": after, "limit": 500},
            headers=AUTH,
            timeout=10,
        ).json()
        seqs += [(b["epoch"], b["seq"]) for b in page["batches"]]
        if not page["batches"]:
            return seqs
        after = page["next_after_seq"]


def test_the_database_unreachable_for_a_while(proxied_api):
    api, proxy = proxied_api
    serve = Serve(api, "fault-db", runner="ledger", geometry=LEDGER)
    try:
        for i in range(3):
            serve.ask(SYSTEM + text_prompt(100 + i, 80))
        wait_for("the first requests in the store", lambda: store_requests(api, "fault-db") == 3)

        proxy.cut()
        # the engine serves on
        hits = [serve.ask(SYSTEM + text_prompt(200 + i, 80)) for i in range(6)]
        assert all(hit >= 288 for hit in hits), hits  # and hits the shared prompt as usual
        pin = httpx.post(
            f"{api.url}/api/v1/pins",
            headers=AUTH,
            json={"prefix": {"text": SYSTEM}, "label": "during the outage"},
            timeout=30,
        )
        assert pin.status_code == 503, pin.text
        assert "database is unreachable" in pin.json()["detail"]
        engines = httpx.get(f"{api.url}/api/v1/engines", headers=AUTH, timeout=30)
        assert engines.status_code == 503 and "retry later" in engines.json()["detail"]
        assert httpx.get(f"{api.url}/healthz", timeout=30).status_code == 503
        assert httpx.get(f"{api.url}/api/v1/pins", headers=AUTH, timeout=30).status_code == 503

        proxy.restore()
        wait_for("the store to catch up", lambda: store_requests(api, "fault-db") == 9, 90)
        wait_for("the store to equal the engine", lambda: store_matches_engine(api, serve))
        seqs = batch_seqs(api, "fault-db")
        assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)  # none applied twice
        pins = httpx.get(f"{api.url}/api/v1/pins", headers=AUTH, timeout=10)
        assert pins.json() == []  # no half-written pin
        pin = httpx.post(
            f"{api.url}/api/v1/pins",
            headers=AUTH,
            json={"prefix": {"text": SYSTEM}, "label": "after the outage"},
            timeout=10,
        )
        assert pin.status_code == 201, pin.text
    finally:
        serve.stop()


def test_a_partition_that_holds_connections_is_answered_503_not_hung(postgres):
    """The proxy keeps every connection open and acknowledges what it is sent, but nothing
    comes back (keepalives are answered by its host): before the statement bound, each
    request hung until the client gave up (past 40 s in the issue). The client here gives up
    at 60 s; the bound is 2 s."""
    proxy = TcpProxy("127.0.0.1", 5432)
    name = postgres.create("junction_partition")
    url = postgres.url(name).replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    env = {"JUNCTION_DB_STATEMENT_TIMEOUT_S": "2", "JUNCTION_DB_CONNECT_TIMEOUT_S": "2"}
    api = ApiProcess(url, free_port(), env=env)
    api.start()
    try:
        for _ in range(3):  # the pool holds open connections when the partition starts
            answer = httpx.get(f"{api.url}/api/v1/engines", headers=AUTH, timeout=10)
            assert answer.status_code == 200
        proxy.freeze()
        for path in ("/api/v1/engines", "/api/v1/pins", "/api/v1/engines", "/healthz"):
            answer = httpx.get(f"{api.url}{path}", headers=AUTH, timeout=60)
            assert answer.status_code == 503, (path, answer.text)
        proxy.restore()
        wait_for(
            "REST to answer again",
            lambda: (
                httpx.get(f"{api.url}/api/v1/engines", headers=AUTH, timeout=10).status_code == 200
            ),
        )
    finally:
        api.kill()
        proxy.close()
        postgres.drop(name)


def test_an_engine_restarted_gets_a_new_epoch_and_its_pins_again(api_process):
    api = api_process
    serve = Serve(api, "fault-restart", runner="ledger", geometry=LEDGER)
    port = serve.port
    try:
        for i in range(4):
            serve.ask(SYSTEM + text_prompt(300 + i, 120))
        created = httpx.post(
            f"{api.url}/api/v1/pins",
            headers=AUTH,
            json={"prefix": {"text": SYSTEM}, "label": "system", "engine_ids": ["fault-restart"]},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        pin_id = created.json()["pin_id"]
        wait_for("the pin", lambda: pin_state(api, pin_id, "fault-restart") == "materialized")
        wait_for("the store to mirror the engine", lambda: store_matches_engine(api, serve))
        before = api_engine(api, "fault-restart")
        assert before["cache"]["attention"]["num_cached"] > 0

        serve.kill()
        serve = Serve(api, "fault-restart", runner="ledger", geometry=LEDGER, port=port)
        wait_for(
            "the new epoch's pin",
            lambda: (
                pin_state(api, pin_id, "fault-restart") == "materialized"
                and api_engine(api, "fault-restart")["epoch"] > before["epoch"]
            ),
            90,
        )
        wait_for("the store to mirror the new engine", lambda: store_matches_engine(api, serve))
        after = api_engine(api, "fault-restart")
        assert after["connected"] and after["epoch"] > before["epoch"]
        # the old epoch's cached blocks are gone: only the re-materialized pin holds blocks
        assert after["cache"]["attention"]["num_cached"] == 0
        assert after["cache"]["attention"]["num_pinned"] > 0
        held = [b for b in api.blocks("fault-restart") if b["state"] != "free"]
        assert {b["group"] for b in held} == {"attention", "mamba"}
        # only the pin's prefill (300 tokens) holds blocks; the old requests' (420) are gone
        assert all(b["token_range"][1] <= 300 for b in held), held
        assert all(b["state"] == "pinned" for b in held if b["group"] == "attention")
        assert serve.ask(SYSTEM + text_prompt(999, 50)) >= 288  # and the pin is hit
    finally:
        serve.stop()


# ---------------------------------------------------------------------------- outage under load
# The suite's outage is short; the (60 s, 9000 requests from 16 clients) runs with
# JUNCTION_TEST_OUTAGE_S=60 JUNCTION_TEST_OUTAGE_REQUESTS=9000 pytest tests/api/test_faults.py -k
# outage -s, which prints what it measured.
OUTAGE_S = float(os.environ.get("JUNCTION_TEST_OUTAGE_S", "4"))
OUTAGE_REQUESTS = int(os.environ.get("JUNCTION_TEST_OUTAGE_REQUESTS", "360"))
OUTAGE_CLIENTS = 16
WAITING = "junction_publisher_requests_waiting"


def publisher_metrics(serve: Serve) -> dict[str, float]:
    text = httpx.get(f"{serve.url}/metrics", timeout=10).text
    return {
        line.split()[0].removesuffix("_total"): float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("junction_publisher_")
    }


class Clients:
    """`OUTAGE_CLIENTS` threads sending completions until `total` are done; `done` counts."""

    def __init__(self, serve: Serve, total: int) -> None:
        self.serve, self.total = serve, total
        self.lock = threading.Lock()
        self.next = self.done = 0
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, daemon=True) for _ in range(OUTAGE_CLIENTS)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if self.next >= self.total or self.errors:
                    return
                index, self.next = self.next, self.next + 1
            try:  # six families of one system prompt
                self.serve.ask(SYSTEM + text_prompt(1000 + index % 6, 20) + text_prompt(index, 30))
            except BaseException as exc:  # noqa: BLE001 (reported by `join`)
                self.errors.append(exc)
                return
            with self.lock:
                self.done += 1

    def join(self, timeout_s: float) -> None:
        for thread in self.threads:
            thread.join(timeout_s)
        assert not self.errors, self.errors[:3]
        assert self.done == self.total


OUTBOXES = {
    "roomy": (),  # the defaults hold the whole outage
    "few-batches": ("--outbox-batches", "16"),  # blocks resync through snapshots
    "request-limit": ("--outbox-bytes", str(96 * 1024)),  # past the stated limit: counted
}


@pytest.mark.parametrize("outbox", list(OUTBOXES))
def test_no_finished_request_is_lost_through_an_outage_under_load(proxied_api, outbox):
    api, proxy = proxied_api
    engine_id = f"outage-{outbox}"
    serve = Serve(api, engine_id, *OUTBOXES[outbox], runner="ledger", geometry=LEDGER)
    try:
        clients = Clients(serve, OUTAGE_REQUESTS)
        wait_for("traffic before the outage", lambda: clients.done >= OUTAGE_REQUESTS // 10)
        proxy.cut()
        cut_at, done_at_cut = time.monotonic(), clients.done
        time.sleep(OUTAGE_S)
        during = publisher_metrics(serve)
        proxy.restore()
        served_during = clients.done - done_at_cut
        clients.join(600)
        wait_for("the outbox to empty", lambda: publisher_metrics(serve)[WAITING] == 0, 120)
        caught_up_s = time.monotonic() - cut_at - OUTAGE_S
        after = publisher_metrics(serve)
        dropped = after["junction_publisher_requests_dropped"]
        stored = store_requests(api, engine_id)
        wait_for("the store to equal the engine", lambda: store_matches_engine(api, serve), 60)
        print(
            f"\n{engine_id}: {OUTAGE_REQUESTS} requests from {OUTAGE_CLIENTS} clients, "
            f"{served_during} served during the {OUTAGE_S:g} s cut; during it the outbox held "
            f"{during[WAITING]:.0f} requests in "
            f"{during['junction_publisher_buffered_bytes']:.0f} bytes; after it "
            f"{after['junction_publisher_snapshots']:.0f} snapshots, "
            f"{after['junction_publisher_batches_dropped']:.0f} batches dropped, "
            f"{dropped:.0f} requests dropped; the store had {stored} requests "
            f"{caught_up_s:.1f} s after the database came back"
        )
        assert served_during > 0  # the engine served on through the cut
        if outbox == "request-limit":  # the drop is counted (an upper bound: an ack may be lost)
            assert dropped > 0 and stored < OUTAGE_REQUESTS <= stored + dropped
            return
        assert stored == OUTAGE_REQUESTS and dropped == 0
        if outbox == "few-batches":
            assert after["junction_publisher_snapshots"] >= 1
            assert after["junction_publisher_batches_dropped"] > 0
        else:
            assert after["junction_publisher_batches_dropped"] == 0
    finally:
        serve.stop()
