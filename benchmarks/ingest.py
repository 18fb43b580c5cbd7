"""Ingest end to end into PostgreSQL: engine -> `EventPublisher` -> websocket -> store, committed.

`junction api` runs in its own process over a scratch database (dropped at the end); a
null-runner engine serves requests on 16 shared prefixes, 8 in flight, on a cache small enough
to evict, with a publisher attached (one batch frame per step).

1. throughput, JSON and msgpack: `live`, the engine stepping flat out, first step to last ack
   (`publisher.flush`); `backlog`, the frames held by the publisher while the engine runs (as
   while the control plane is away), their release to the last ack: what ingest can take.
   The store's `/api/v1/engines/{id}/blocks` must then equal the engine's table.
2. lag, msgpack, engine paced to each `--rate`: a thread polls `/api/v1/events` every 5 ms;
   a batch's lag is when it was first seen minus its `ts` (stamped as the engine made it).
3. replicas: 1, 2 and 3 `junction api` processes on the one database behind HAProxy
   (`stack.balancer`, leastconn), `--engines` engines connected through it, each holding a
   backlog of `--events / --engines` events, released at once: events/s from the release to
   the last ack, per replica and against 1 replica (every engine's table in the store must
   equal its own); then the lag at 5,000 events/s through the balancer with 1 and 3
   replicas. The CPU seconds each part spent meanwhile (the api processes, the database's
   backends, HAProxy, this process: the engines and their publishers; `/proc/<pid>/stat`)
   say where the ceiling is on this machine. HAProxy runs as compose's does (`stack.balancer`).
4. breakdown: each stage alone, in this process, frame by frame (the hello carries the
   engine's geometry, as a publisher's does, so miss attribution runs).

Targets, per replica: >= 25,000 events/s from a backlog, p99 lag < 500 ms at 5,000 events/s.
Figures on a shared machine move with its load: compare the ratios of one run.

    .venv/bin/python benchmarks/ingest.py [--events 100000] [--rate 1000 5000 10000]
        [--duration 10] [--engines 6] [--replicas 1 2 3]
        [--database-url postgresql://postgres@127.0.0.1:5432/db] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import httpx
import psycopg
from sqlalchemy import event
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `benchmarks.ports` is beside it
    sys.path.insert(0, str(REPO))

from api.ingest.frames import apply_batches, apply_hello  # noqa: E402
from api.routes.ingest import DECODE_AHEAD  # noqa: E402
from api.settings import Settings  # noqa: E402
from api.store.db import make_engine, make_sessionmaker  # noqa: E402
from benchmarks.ports import free_port  # noqa: E402
from engine.config import CacheConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.request import SamplingParams  # noqa: E402
from engine.wire import decode, encode  # noqa: E402
from publish.publisher import EventPublisher  # noqa: E402
from stack.balancer import Balancer  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TOKEN = "bench-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}  # reads need the token too
TARGET_EVENTS_S = 25_000  # per replica, from a backlog
TARGET_P99_S = 0.5  # the lag at TARGET_RATE
TARGET_RATE = 5_000
IN_FLIGHT, NUM_BLOCKS = 8, 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Workload:
    """An engine serving requests on shared prefixes; counts the events its steps emit."""

    def __init__(self, engine_id: str, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        config = CacheConfig(num_blocks=NUM_BLOCKS, mamba_block_size=64)
        self.engine = Engine(config, runner="null", engine_id=engine_id)
        self.prefixes = [self.tokens(self.rng.choice((256, 512, 1024))) for _ in range(16)]
        self.in_flight = self.num_events = self.num_rows = 0
        self.engine.step_listeners.append(self.count)  # ahead of a publisher's: sees it all

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(256) for _ in range(n)]

    def count(self, engine: Engine) -> None:
        self.num_events += len(engine.sink.events)
        self.num_rows += sum(len(e.blocks) for e in engine.sink.events if hasattr(e, "blocks"))

    def step(self) -> int:
        """One engine step, topping up the requests in flight; returns the events it made."""
        for _ in range(IN_FLIGHT - self.in_flight):
            prompt = self.rng.choice(self.prefixes) + self.tokens(self.rng.randrange(16, 256))
            self.engine.add_request(prompt, SamplingParams(max_tokens=self.rng.randrange(1, 16)))
            self.in_flight += 1
        before = self.num_events
        self.in_flight -= len(self.engine.step())
        return self.num_events - before

    def publish(self, base: str, binary: bool) -> EventPublisher:
        publisher = EventPublisher(base, TOKEN, binary=binary, max_batches=1_000_000)
        publisher.attach(self.engine)
        deadline = time.monotonic() + 30
        while not publisher.stats().is_connected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"publisher never connected: {publisher.stats().last_error}")
            time.sleep(0.01)
        return publisher


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def flush(publisher: EventPublisher) -> None:
    if not publisher.flush(timeout_s=120):
        raise RuntimeError(f"the store did not ack every frame in 120 s: {publisher.stats()}")


def throughput(base: str, num_events: int, binary: bool, backlog: bool) -> None:
    kind, mode = "msgpack" if binary else "JSON", "backlog" if backlog else "live"
    work = Workload(f"bench-{mode}-{kind.lower()}")
    publisher = work.publish(base, binary)
    started = time.perf_counter()
    # the sender takes frames under the publisher's lock (an RLock): holding it keeps them here
    with publisher.cond if backlog else nullcontext():
        with tqdm(total=num_events, desc=f"{mode} {kind}", unit="ev", leave=False) as bar:
            while work.num_events < num_events:
                bar.update(work.step())
        started = time.perf_counter() if backlog else started
    flush(publisher)
    elapsed, frames = time.perf_counter() - started, publisher.stats().num_sent
    publisher.close()
    rate = work.num_events / elapsed
    print(
        f"throughput {kind:7} {mode:7}: {work.num_events:,} events ({work.num_rows:,} block rows, "
        f"{frames:,} frames) in {elapsed:.2f} s: {rate:,.0f} events/s, "
        f"{work.num_rows / elapsed:,.0f} rows/s "
        f"[target >= {TARGET_EVENTS_S:,} events/s: {verdict(rate >= TARGET_EVENTS_S)}]"
    )
    if wrong := differences(base, work.engine):
        print(f"  !! the store's block table differs from the engine's in {wrong} rows")


def get_json(client: httpx.Client, url: str, params: dict | None = None) -> dict:
    """The page at `url`; a 503 (the read limit, or a balancer whose replicas are all marked
    down for a moment) is asked again, for up to a minute."""
    deadline = time.monotonic() + 60
    while (response := client.get(url, params=params)).status_code == 503:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    response.raise_for_status()
    return response.json()


def differences(base: str, engine: Engine) -> int:
    """Rows where the store's block table differs from the engine's (untouched ones are free)."""
    rows = json.loads(json.dumps(engine.snapshot()["blocks"]))  # tuples as lists, as stored
    table = {(row["group"], row["block_id"]): row for row in rows}
    url = f"{base}/api/v1/engines/{engine.engine_id}/blocks?limit=10000"
    page = get_json(httpx.Client(headers=AUTH, timeout=60), url)
    stored = {(row["group"], row["block_id"]): row for row in page["blocks"]}
    wrong = sum(row != table[key] for key, row in stored.items())
    return wrong + sum(row["state"] != "free" for k, row in table.items() if k not in stored)


class Readers:
    """`num` threads reading what a dashboard reads (a block-table page, requests, the hit
    rate) as fast as the API answers, until `stop`; counts the reads and the 503s."""

    def __init__(self, base: str, engine_id: str, num: int) -> None:
        self.base, self.engine_id = base, engine_id
        self.stopping = threading.Event()
        self.num_reads = self.num_busy = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, daemon=True) for _ in range(num)]
        for thread in self.threads:
            thread.start()

    def _read(self) -> None:
        paths = [
            f"/api/v1/engines/{self.engine_id}/blocks?limit=1000",
            f"/api/v1/engines/{self.engine_id}/requests?limit=100",
            f"/api/v1/engines/{self.engine_id}/hit-rate",
        ]
        with httpx.Client(base_url=self.base, headers=AUTH, timeout=60) as client:
            while not self.stopping.is_set():
                for path in paths:
                    status = client.get(path).status_code
                    with self.lock:
                        self.num_reads += 1
                        self.num_busy += status == 503

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)


def percentiles(values: list[float]) -> tuple[float, float]:
    """The median and the p99."""
    values = sorted(values)
    return statistics.median(values), values[int(0.99 * (len(values) - 1))]


def lag(base: str, rate: int, duration: float, readers: int = 0) -> dict[str, float]:
    """The lag run at `rate` events/s, with `readers` reader threads beside it; prints its
    figures and returns the p99s in seconds: `visible` (a batch made until a reader of
    `/api/v1/events` first saw it) and `committed` (made until the store acknowledged it)."""
    work = Workload(f"bench-lag-{rate}-{readers}", seed=rate)
    publisher = work.publish(base, binary=True)
    lags: list[float] = []
    last_seq = [-1]  # set at the end: the poller stops once it has seen it
    made: collections.deque[tuple[int, float]] = collections.deque()  # (seq, when it was made)
    commit_lags: list[float] = []
    outbox_ack = publisher.outbox.ack

    def ack(seq: int) -> None:  # on the publisher's reader thread
        outbox_ack(seq)
        now = time.time()
        while made and made[0][0] <= seq:
            commit_lags.append(now - made.popleft()[1])

    publisher.outbox.ack = ack

    def poll() -> None:
        params = {"engine_id": work.engine.engine_id, "after_seq": -1, "limit": 1000}
        with httpx.Client(base_url=base, headers=AUTH, timeout=30) as client:
            while last_seq[0] < 0 or params["after_seq"] < last_seq[0]:
                page = get_json(client, "/api/v1/events", params)
                now = time.time()
                lags.extend(now - batch["ts"] for batch in page["batches"])
                params["after_seq"] = page["next_after_seq"]
                if not page["batches"]:
                    time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    reading = Readers(base, work.engine.engine_id, readers) if readers else None
    started = time.perf_counter()
    with tqdm(total=int(rate * duration), desc=f"{rate:,} events/s", unit="ev", leave=False) as bar:
        while (elapsed := time.perf_counter() - started) < duration:
            seq = publisher.next_seq
            bar.update(work.step())
            made.extend((s, time.time()) for s in range(seq, publisher.next_seq))
            time.sleep(max(0.0, work.num_events / rate - elapsed))  # paced to `rate`
    achieved = work.num_events / (time.perf_counter() - started)
    read_s = time.perf_counter() - started
    if reading is not None:
        reading.stop()
    # what was still unacknowledged when the engine stopped, in seconds of events
    behind_s = publisher.stats().num_buffered * work.num_events / publisher.next_seq / rate
    flush(publisher)
    last_seq[0] = publisher.next_seq - 1
    poller.join(120)
    publisher.close()
    p50, p99 = percentiles(lags)
    c50, c99 = percentiles(commit_lags)
    target = f" [target p99 < {TARGET_P99_S * 1e3:.0f} ms: {verdict(p99 < TARGET_P99_S)}]"
    beside = ""
    if reading is not None:
        beside = (
            f" beside {readers} readers ({reading.num_reads / read_s:,.0f} reads/s, "
            f"{reading.num_busy:,} answered 503)"
        )
    print(
        f"lag at {rate:>6,} events/s{beside}: achieved {achieved:,.0f} events/s, "
        f"{len(lags):,} batches, "
        f"{behind_s:.2f} s of events unacked as the engine stopped "
        f"({'kept up' if achieved >= 0.95 * rate and behind_s < 1 else 'FELL BEHIND'}): "
        f"median {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms{target if rate == TARGET_RATE else ''}"
    )
    print(f"  made to committed (acked): median {c50 * 1e3:.0f} ms, p99 {c99 * 1e3:.0f} ms")
    return {"visible": p99, "committed": c99}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process `pid` has used; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy (anyone's), from `/proc/stat`."""
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = map(
            int, stat.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


class CpuMeter:
    """The CPU seconds the benchmark's parts spend between `start` and `stop`: the api
    processes, the database's backends for `database` (their pids from `pg_stat_activity`,
    looked up every quarter second, so backends that come and go are counted), HAProxy, this
    process, and the whole machine."""

    def __init__(self, parts: dict[str, list[int]], database: str) -> None:
        self.parts = {name: list(pids) for name, pids in parts.items()}
        self.database = database
        self.first: dict[int, float] = {}  # pid -> CPU seconds when first seen
        self.last: dict[int, float] = {}
        self.stopping = threading.Event()

    def _backends(self, admin: psycopg.Connection) -> list[int]:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        return [pid for (pid,) in admin.execute(query, (self.database,))]

    def _sample(self, admin: psycopg.Connection, started: bool) -> None:
        self.parts["postgres"] = sorted(set(self.parts["postgres"]) | set(self._backends(admin)))
        for pid in (pid for pids in self.parts.values() for pid in pids):
            used = cpu_seconds(pid)
            if used is not None:
                # a backend first seen after the start began within the window
                self.first.setdefault(pid, used if not started else 0.0)
                self.last[pid] = used

    def __enter__(self) -> CpuMeter:
        self.parts["postgres"] = []
        self.parts["this process"] = [os.getpid()]
        self.admin = psycopg.connect(ADMIN_URL, autocommit=True)
        self._sample(self.admin, started=False)
        self.machine = machine_busy_seconds()
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            while not self.stopping.wait(0.25):
                self._sample(admin, started=True)

    def __exit__(self, *_) -> None:
        self.stopping.set()
        self.thread.join(10)
        self._sample(self.admin, started=True)
        self.admin.close()
        self.elapsed = time.perf_counter() - self.started
        self.machine = machine_busy_seconds() - self.machine

    def used(self) -> dict[str, float]:
        """CPU seconds by part, then `other` (the rest of the machine: anyone else's work)."""
        spent = {
            name: sum(self.last.get(p, 0.0) - self.first.get(p, 0.0) for p in pids)
            for name, pids in self.parts.items()
        }
        spent["other"] = max(0.0, self.machine - sum(spent.values()))
        return spent


def start_servers(url: str, num: int, logs: Path) -> list[subprocess.Popen]:
    """`num` `junction api` processes on `url`: the first alone (it migrates), the rest at once."""
    servers = [start_server(url, logs / "api-0.log")[0]]
    with ThreadPoolExecutor(num) as pool:
        more = pool.map(lambda i: start_server(url, logs / f"api-{i}.log")[0], range(1, num))
        servers.extend(more)
    return servers


class ReplicaRun(NamedTuple):
    num_replicas: int
    num_events: int
    elapsed: float
    cpu: dict[str, float]  # CPU seconds by part, as `CpuMeter.used`
    machine_s: float  # busy CPU seconds of the whole machine
    wrong: int  # rows where a store table differs from its engine's

    @property
    def rate(self) -> float:
        return self.num_events / self.elapsed


def replicas_backlog(
    balancer: Balancer, servers: list, database: str, num_events: int, num_engines: int
) -> ReplicaRun:
    """`num_engines` engines through the balancer, each holding a backlog of its share of
    `num_events`, released together; events/s from the release to the last ack."""
    works = [Workload(f"bench-r{len(servers)}-{i}", seed=100 + i) for i in range(num_engines)]
    publishers = [work.publish(balancer.url, binary=True) for work in works]
    with contextlib.ExitStack() as held:  # each sender waits on its publisher's lock
        for publisher in publishers:
            held.enter_context(publisher.cond)
        share = num_events // num_engines
        with tqdm(total=share * num_engines, desc="backlog", unit="ev", leave=False) as bar:
            for work in works:
                while work.num_events < share:
                    bar.update(work.step())
        parts = {"api": [server.pid for server in servers], "haproxy": [balancer.process.pid]}
        meter = CpuMeter(parts, database)
        meter.__enter__()  # from the release
    try:
        for publisher in publishers:
            flush(publisher)
    finally:
        meter.__exit__()
        for publisher in publishers:
            publisher.close()
    wrong = sum(differences(balancer.url, work.engine) for work in works)
    total = sum(work.num_events for work in works)
    return ReplicaRun(len(servers), total, meter.elapsed, meter.used(), meter.machine, wrong)


def replicas(
    url: str, counts: list[int], num_events: int, num_engines: int, duration: float, logs: Path
) -> None:
    """The replicas section (3. in the module docstring): one table, the lags, the ceiling.
    The api processes start once; a run with N replicas puts a balancer before the first N
    (the others idle meanwhile)."""
    database = url.rsplit("/", 1)[1]
    runs: list[ReplicaRun] = []
    lags: dict[int, dict[str, float]] = {}
    servers = start_servers(url, max(counts), logs)
    try:
        for num in counts:
            backends = [f"127.0.0.1:{server.port}" for server in servers[:num]]
            with Balancer(backends=backends, port=free_port()) as balancer:
                run = replicas_backlog(balancer, servers[:num], database, num_events, num_engines)
                runs.append(run)
                if num in (counts[0], counts[-1]):
                    print(f"through the balancer, {num} replica(s):", end=" ")
                    lags[num] = lag(balancer.url, TARGET_RATE, duration)
    finally:
        for server in servers:
            stop(server)
    one = runs[0].rate / runs[0].num_replicas
    print(
        f"\nreplicas behind HAProxy, {num_engines} engines releasing a backlog of "
        f"{runs[0].num_events:,} events (msgpack); CPU seconds per 1,000 events by part"
    )
    print(
        "| replicas | events/s | per replica | vs 1 replica | api | postgres | haproxy "
        "| engines (this process) | machine busy | other load | store = engines |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        per = 1e3 / run.num_events
        cores = run.machine_s / run.elapsed
        print(
            f"| {run.num_replicas} | {run.rate:,.0f} | {run.rate / run.num_replicas:,.0f} "
            f"[{verdict(run.rate / run.num_replicas >= TARGET_EVENTS_S)}] "
            f"| {run.rate / runs[0].rate:.2f}x | {run.cpu['api'] * per * 1e3:.0f} ms "
            f"| {run.cpu['postgres'] * per * 1e3:.0f} ms | {run.cpu['haproxy'] * per * 1e3:.1f} ms "
            f"| {run.cpu['this process'] * per * 1e3:.0f} ms | {cores:.2f} of {os.cpu_count()} "
            f"cores | {run.cpu['other'] / run.elapsed:.2f} cores "
            f"| {'yes' if run.wrong == 0 else f'NO: {run.wrong} rows differ'} |"
        )
    for num, p99 in lags.items():
        print(
            f"p99 lag at {TARGET_RATE:,} events/s through the balancer, {num} replica(s): "
            f"{p99['visible'] * 1e3:.0f} ms to REST, {p99['committed'] * 1e3:.0f} ms to the ack "
            f"[target < {TARGET_P99_S * 1e3:.0f} ms: {verdict(p99['visible'] < TARGET_P99_S)}]"
        )
    print(ceiling(runs, one))


def ceiling(runs: list[ReplicaRun], one: float) -> str:
    """Where the ceiling is, from the runs' own figures: the cores (busy, by whom), or not."""
    last = runs[-1]
    cores = os.cpu_count() or 1
    busy = last.machine_s / last.elapsed / cores
    ours = {k: v for k, v in last.cpu.items() if k != "other"}
    top = max(ours, key=ours.get)
    shares = ", ".join(f"{k} {v / last.machine_s:.0%}" for k, v in last.cpu.items())
    scale = last.rate / runs[0].rate
    api_core = last.cpu["api"] / last.num_events  # CPU seconds per event
    lines = [
        f"ceiling: with {last.num_replicas} replicas the machine's {cores} cores were "
        f"{busy:.0%} busy ({shares} of the busy time); {last.num_replicas} replicas made "
        f"{scale:.2f}x one."
    ]
    other = last.cpu["other"] / last.machine_s
    if other >= 0.2:
        lines.append(
            f"  the machine was shared: processes outside this benchmark took {other:.0%} of "
            "the busy time, so the events/s above are lower bounds; the CPU per 1,000 events "
            "is what carries over to a machine of its own."
        )
    if busy >= 0.9:
        lines.append(
            f"  CPU-bound: the cores are full, so replicas on this machine cannot add speed; "
            f"the biggest share is {top}'s. The api processes need {api_core * 1e6:.0f} ms of "
            f"CPU per 1,000 events: a core each would take {1 / api_core:,.0f} events/s per "
            f"replica, with PostgreSQL and the engines elsewhere."
        )
    else:
        lines.append(
            "  not CPU-bound: the cores had room, so the ceiling is a wait (the database's "
            "commits and locks, or the balancer's hops)."
        )
    return "\n".join(lines)


def breakdown(url: str, num_events: int) -> None:
    """Each stage alone, frame by frame, nothing kept between frames (as in the server)."""
    work = Workload("bench-breakdown", seed=1)
    db = make_engine(Settings(database_url=url).database_url)
    sessions, clock = make_sessionmaker(db), time.perf_counter
    one, many = "apply_batch, 1 frame a commit", f"apply_batches, {DECODE_AHEAD} frames a commit"
    stages = ["engine: step", "engine: event.to_dict", "publisher: encode JSON"]
    stages += ["publisher: encode msgpack", "server: decode JSON", "server: decode msgpack"]
    stages += [f"server: {one}", "  of which SQL statements", f"server: {many}"]
    stages += ["  of which SQL statements, grouped"]
    spent, sql = dict.fromkeys(stages, 0.0), [stages[7], 0.0]  # [stage, statement start]

    def timed(stage: str, fn, *args):
        start = clock()
        out = fn(*args)
        spent[stage] += clock() - start
        return out

    def apply(hello, batches: list) -> None:
        with sessions() as session:
            apply_batches(session, hello, batches)

    def sql_done(*_) -> None:
        spent[sql[0]] += clock() - sql[1]

    event.listen(db, "before_cursor_execute", lambda *_: sql.__setitem__(1, clock()))
    event.listen(db, "after_cursor_execute", sql_done)
    epoch = time.time_ns()  # a new one, should the database be one of an earlier run
    table = work.engine.snapshot()  # the geometry a publisher's hello carries: attribution runs
    geometry = {**table["geometry"], "groups": table["groups"]}
    hello = {"type": "hello", "epoch": epoch, "geometry": geometry}
    hellos = [decode(encode(hello | {"engine_id": i})) for i in "1n"]
    for hello in hellos:
        with sessions() as session:
            apply_hello(session, hello)
    later: list[bytes] = []  # the same frames again, for the other engine id
    with tqdm(total=num_events, desc="breakdown", unit="ev", leave=False) as bar:
        while work.num_events < num_events:
            bar.update(timed(stages[0], work.step))
            events = timed(stages[1], lambda: [e.to_dict() for e in work.engine.sink.drain()])
            body = {"type": "batch", "engine_id": "1", "epoch": epoch, "seq": len(later)}
            body |= {"ts": time.time(), "events": events}
            text, blob = timed(stages[2], encode, body), timed(stages[3], encode, body, True)
            later.append(encode(body | {"engine_id": "n"}, binary=True))
            timed(stages[4], decode, text)
            timed(stages[6], apply, hellos[0], [timed(stages[5], decode, blob)])
        sql[0] = stages[9]
        for start in range(0, len(later), DECODE_AHEAD):
            frames = [decode(frame) for frame in later[start : start + DECODE_AHEAD]]
            timed(stages[8], apply, hellos[1], frames)
    db.dispose()
    print(
        f"breakdown over {work.num_events:,} events ({work.num_rows:,} block rows, {len(later):,} "
        "frames), each stage alone: ms per 1000 events, and the rate it alone would allow"
    )
    ms = {stage: seconds * 1e6 / work.num_events for stage, seconds in spent.items()}
    for stage, each in ms.items():
        print(f"  {stage:48} {each:6.1f} ms {1e6 / each:>10,.0f} events/s")
    server = ms[stages[5]] + ms[stages[8]]
    engine = ms[stages[0]] + ms[stages[1]] + ms[stages[3]]
    print(
        f"  one core each: server (decode msgpack + grouped apply) {server:.1f} ms -> "
        f"{1e6 / server:,.0f} events/s; engine process (step + to_dict + encode msgpack) "
        f"{engine:.1f} ms -> {1e6 / engine:,.0f} events/s"
    )


def start_server(
    url: str, log: Path, settings: dict[str, str] | None = None, log_level: str = "warning"
) -> tuple[subprocess.Popen, str]:
    """`junction api` on `url` (with more `JUNCTION_*` `settings`), its output in `log`; the
    process and its base URL once it answers /healthz."""
    port = free_port()
    env = (
        os.environ | (settings or {}) | {"JUNCTION_DATABASE_URL": url, "JUNCTION_API_TOKEN": TOKEN}
    )
    env["JUNCTION_LOG_LEVEL"] = log_level
    command = [str(Path(sys.executable).parent / "junction"), "api", "--port", str(port)]
    with log.open("wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    server.port = port
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # a fresh database migrates first: slow on a busy machine
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return server, base
        except httpx.TransportError:
            time.sleep(0.1)
    stop(server)
    raise RuntimeError(f"junction api did not start:\n{log.read_text()[-3000:]}")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="per throughput run")
    parser.add_argument("--rate", type=int, nargs="+", default=[1_000, 5_000, 10_000])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per paced run")
    parser.add_argument("--engines", type=int, default=6, help="engines in the replicas runs")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--database-url", help="an existing database (default: a scratch one)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the replicas (6,000 events, 2 s at 5,000/s) and a breakdown of 2,000",
    )
    args = parser.parse_args()
    if args.quick:
        args.events, args.duration = 6_000, 2.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up below on a kill too
    scratch = None if args.database_url else f"junction_bench_{uuid.uuid4().hex[:12]}"
    if scratch:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{scratch}"')
    url = args.database_url or f"{ADMIN_URL.rsplit('/', 1)[0]}/{scratch}"
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if not args.quick:
                server, base = start_server(url, Path(tmp) / "api.log")
                print(f"junction api (pid {server.pid}) at {base}, database {url.rsplit('/')[-1]}")
                for binary in (False, True):
                    for backlog in (False, True):
                        throughput(base, args.events, binary, backlog)
                for rate in args.rate:
                    lag(base, rate, args.duration)
                stop(server)  # the replicas and the breakdown start their own
                server = None
            replicas(url, args.replicas, args.events, args.engines, args.duration, Path(tmp))
            breakdown(url, 2_000 if args.quick else min(args.events, 50_000))
    finally:
        if server is not None:
            stop(server)
        if scratch:
            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


if __name__ == "__main__":
    main()
