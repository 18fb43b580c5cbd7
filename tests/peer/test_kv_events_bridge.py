"""`junction attach vllm` end to end: vLLM 0.33's own scheduler, `KVCacheManager` and
`ZmqEventPublisher` (benchmarks/peer/vllm_kv_events.py) publishing on loopback, the bridge in
its own process, `junction api` on PostgreSQL. The store's hash-keyed table
(`GET /engines/{id}/peer-blocks`) must equal vLLM's block pool, group by group, at sampled
points of a shared-prefix trace whose pool is small enough to evict, and at its end; with
live messages lost it still must (the replay fills them), and without a replay socket the loss
reaches the store as a resync (`GET /engines/{id}/peer-summary`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from attach.bridge.translate import group_name
from benchmarks.bridge import KvEventsPeer
from tests.api.conftest import POSTGRES_ADMIN_URL, Postgres, api_on_postgres
from tests.api.processes import AUTH, TOKEN, ApiProcess, api_engine, free_port
from tests.peer.conftest import family_trace
from tests.polling import wait_until

NUM_SAMPLES = 4


@pytest.fixture(scope="module")
def api() -> Iterator[ApiProcess]:
    server = Postgres(POSTGRES_ADMIN_URL)
    if not server.is_reachable():
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}")
    with api_on_postgres(server, "junction_bridge") as process:
        yield process


@pytest.fixture(scope="module")
def vllm() -> Iterator[KvEventsPeer]:
    with KvEventsPeer(True) as peer:
        yield peer


class Attach:
    """`junction attach vllm` in its own process."""

    def __init__(
        self, api: ApiProcess, peer: KvEventsPeer, engine_id: str, *extra: str, replay: bool = True
    ) -> None:
        self.engine_id = engine_id
        self.metrics_port = free_port()
        command = [
            sys.executable,
            "-m",
            "cli.main",
            "attach",
            "vllm",
            "--events",
            peer.events_url,
            "--engine-id",
            engine_id,
            "--control-plane",
            api.url,
            "--token",
            TOKEN,
            "--metrics-port",
            str(self.metrics_port),
            "--log-level",
            "info",
            *extra,
        ]
        if replay:
            command += ["--replay", peer.replay_url]
        # the log goes to a file: a pipe nobody reads until the end fills up (64 KiB), and the
        # bridge then blocks in its next log line, reconnecting to nothing
        self.log_file = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            command,
            env={**os.environ},
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
            text=True,
        )
        assert wait_until(lambda: api_engine(api, engine_id).get("connected"), 60, 0.2), self.log()

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        page = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        return 0.0

    def log(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.log_file.seek(0)
        return self.log_file.read()

    def stop(self) -> str:
        log = self.log()
        print(log)  # shown with a failure
        return log


def stored_table(api: ApiProcess, engine_id: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for block in api.all_blocks(engine_id, "peer-blocks"):
        assert block["rank"] == 0 and block["medium"] == "GPU"
        found.setdefault(block["group"], set()).add(block["hash"])
    return found


def pool_table(pool: dict) -> dict[str, set[str]]:
    return {
        group_name(g["kind"], int(idx)): set(g["hashes"])
        for idx, g in pool["groups"].items()
        if g["hashes"]
    }


def assert_store_equals_pool(api: ApiProcess, engine_id: str, pool: dict, what: str) -> None:
    expected = pool_table(pool)
    if wait_until(lambda: stored_table(api, engine_id) == expected, 60, 0.3):
        return
    stored = stored_table(api, engine_id)
    report = {
        g: (
            len(expected.get(g, ())),
            len(stored.get(g, ())),
            len(expected.get(g, set()) - stored.get(g, set())),
            len(stored.get(g, set()) - expected.get(g, set())),
        )
        for g in set(expected) | set(stored)
    }
    pytest.fail(f"{what}: store != vLLM's pool; (vllm, store, missing, extra) {report}")


def segments(seed: int) -> list[list[dict]]:
    requests = family_trace(seed, num_requests=8 * NUM_SAMPLES, max_prompt=2000)
    for r in requests:
        r["id"] = f"{r['id']}-{seed}"
    size = len(requests) // NUM_SAMPLES
    return [requests[i : i + size] for i in range(0, len(requests), size)]


def summary(api: ApiProcess, engine_id: str) -> dict:
    url = f"{api.url}/api/v1/engines/{engine_id}/peer-summary"
    return httpx.get(url, headers=AUTH, timeout=10).json()


def test_the_store_equals_vllms_pool(api: ApiProcess, vllm: KvEventsPeer) -> None:
    bridge = Attach(api, vllm, "vllm-exact")
    try:
        num_evicted = 0
        previous: set[str] = set()
        for n, segment in enumerate(segments(1)):
            vllm.replay(segment)
            pool = vllm.pool()
            attention = pool_table(pool).get("attention", set())
            num_evicted += len(previous - attention)
            previous = attention
            assert_store_equals_pool(api, "vllm-exact", pool, f"sample {n}")
        assert num_evicted > 0, "the pool never evicted: make it smaller"
        assert set(pool_table(pool)) == {"attention", "mamba"}
        assert bridge.metric("junction_bridge_resyncs_total") == 0
        assert summary(api, "vllm-exact")["resyncs"] == []
    finally:
        bridge.stop()


def test_lost_live_messages_are_filled_from_the_replay(api, vllm: KvEventsPeer) -> None:
    start = vllm.pool()["num_published"]
    lost = f"0:{start + 3}-{start + 12}"
    bridge = Attach(api, vllm, "vllm-gaps", "--drop-seqs", lost)
    try:
        assert_store_equals_pool(api, "vllm-gaps", vllm.pool(), "after the start replay")
        for segment in segments(2)[:2]:
            vllm.replay(segment)
        pool = vllm.pool()
        assert pool["num_published"] > start + 12
        assert_store_equals_pool(api, "vllm-gaps", pool, "after the gap")
        assert bridge.metric("junction_bridge_gaps_total", rank="0") == 1
        assert bridge.metric("junction_bridge_replayed_batches_total", rank="0") >= 10 + start
        assert summary(api, "vllm-gaps")["resyncs"] == []
    finally:
        log = bridge.stop()
    assert f"seqs {start + 3}..{start + 12} missing on the live socket" in log


def test_without_the_replay_a_loss_is_a_resync_in_the_store(api, vllm: KvEventsPeer) -> None:
    start = vllm.pool()["num_published"]
    bridge = Attach(
        api, vllm, "vllm-lossy", "--drop-seqs", f"0:{start + 2}-{start + 4}", replay=False
    )
    try:
        vllm.replay(segments(3)[0])
        assert vllm.pool()["num_published"] > start + 4

        def resyncs() -> list[tuple[int, int, str]]:
            return [
                (r["first_missing_seq"], r["resumed_seq"], r["reason"])
                for r in summary(api, "vllm-lossy")["resyncs"]
            ]

        assert wait_until(
            lambda: (start + 2, start + 5, "no replay socket") in resyncs(), 60, 0.3
        ), resyncs()
        if start:  # the bridge came after seq 0 and had no replay to ask for the past
            assert (0, start, "no replay socket") in resyncs()
        assert (
            bridge.metric("junction_bridge_resyncs_total", rank="0", reason="no replay socket") >= 1
        )
    finally:
        log = bridge.stop()
    assert "(no replay socket): resync" in log


def test_a_publisher_restart_empties_the_rank_and_the_bridge_carries_on(api) -> None:
    with KvEventsPeer(True) as first:
        bridge = Attach(api, first, "vllm-restart")
        for segment in segments(4)[:2]:
            first.replay(segment)
        assert_store_equals_pool(api, "vllm-restart", first.pool(), "before the restart")
        ports = (first.events_port, first.replay_port)
        connections = bridge.metric("junction_bridge_live_connections_total", rank="0")
    try:
        with KvEventsPeer(True, ports=ports) as second:  # vLLM again: seq 0, an empty cache
            # what a PUB sends before a SUB has joined it is lost to that SUB: publish once the
            # bridge's new live socket has met the new publisher (a restart seen mid-stream
            # is the unit tests' case)
            assert wait_until(
                lambda: (
                    bridge.metric("junction_bridge_live_connections_total", rank="0") > connections
                ),
                30,
                0.2,
            ), bridge.log()
            second.replay(segments(5)[0][:3])
            pool = second.pool()
            assert_store_equals_pool(api, "vllm-restart", pool, "after the restart")
            reasons = [r["reason"] for r in summary(api, "vllm-restart")["resyncs"]]
            assert reasons == ["publisher restart"]
    finally:
        log = bridge.stop()
    assert "the publisher restarted" in log
