"""A bounded soak: several engines stream into one `junction api` on PostgreSQL for a while,
under short retention settings; the database's size must level off instead of growing.

A scratch database (dropped at the end) and `junction api` on it, its environment setting
windows scaled to the run (for the default 900 s: prune every 10 s, batches kept 60 s,
requests 120 s, buckets of 10 s rolled up into 60 s ones after 120 s, dropped after 225 s).
`--engines` null-runner engines (`benchmarks.ingest.Workload`), each stepping `--steps` times
a second (a batch a step: a steady stream of batches and requests, whatever the cache's hits
do to the events a step), each with an `EventPublisher`. Every `--every` seconds it prints
the elapsed time, `pg_database_size`, the rows of `event_batches`, `requests`,
`hit_rate_buckets` and `attributions`, the events the store committed and the largest
tables; at the end, the growth over the last third of the run against the first third (the
windows fill in the first), and exits 1 unless it levelled off.

The API's own retention task prunes (`api.retention`, started by its lifespan); `--prune-here`
runs the same rounds in this process instead, for an API that does not start it.

    .venv/bin/python benchmarks/soak.py [--duration 900] [--engines 4] [--steps 10] [--quick]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `benchmarks.ingest` is beside it
    sys.path.insert(0, str(REPO))

from api import retention  # noqa: E402
from api.settings import Settings  # noqa: E402
from api.store.db import make_engine, make_sessionmaker  # noqa: E402
from benchmarks.ingest import TOKEN, Workload, start_server, stop  # noqa: E402
from publish.publisher import EventPublisher  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
LEVEL_SHARE = 0.25  # levelled off: the last third grew at most this share of the first's


def retention_env(duration: float) -> dict[str, str]:
    """`JUNCTION_*` settings that turn the store over several times in `duration` seconds."""
    bucket_s = max(1, round(duration / 90))
    return {
        "JUNCTION_HIT_RATE_BUCKET_S": str(bucket_s),
        "JUNCTION_RETENTION_INTERVAL_S": str(duration / 90),
        "JUNCTION_RETENTION_CHUNK_ROWS": "2000",
        "JUNCTION_RETENTION_BATCHES_S": str(duration / 15),
        "JUNCTION_RETENTION_BATCHES_PER_ENGINE": "100000",
        "JUNCTION_RETENTION_REQUESTS_S": str(duration / 7.5),
        "JUNCTION_RETENTION_REQUESTS_PER_ENGINE": "1000000",
        "JUNCTION_RETENTION_ROLLUP_AFTER_S": str(duration / 7.5),
        "JUNCTION_RETENTION_ROLLUP_BUCKET_S": str(6 * bucket_s),
        "JUNCTION_RETENTION_BUCKETS_S": str(duration / 4),
        # attribution's own bounds (`api.attribution.shared_units`), in step
        "JUNCTION_ATTRIBUTION_WINDOW_S": str(duration / 7.5),
    }


class Sample(NamedTuple):
    elapsed_s: float
    size_bytes: int
    rows: dict[str, int]  # by table
    largest: str  # the largest tables' sizes
    num_events: int  # committed by the store


class Driver:
    """An engine stepping `rate` times a second in a thread, published to `base`."""

    def __init__(self, base: str, index: int, rate: float) -> None:
        self.work = Workload(f"soak-{index}", seed=index)
        self.publisher = EventPublisher(base, TOKEN, binary=True, max_batches=100_000)
        self.publisher.attach(self.work.engine)
        self.rate, self.stopping = rate, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        started, num_steps = time.perf_counter(), 0
        while not self.stopping.is_set():
            self.work.step()
            num_steps += 1
            ahead = num_steps / self.rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.publisher.close()


def sample(url: str, base: str, started: float) -> Sample:
    with psycopg.connect(url) as db:
        size = db.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        rows = {
            table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("event_batches", "requests", "hit_rate_buckets", "attributions")
        }
    text = httpx.get(f"{base}/metrics", timeout=30).text
    events = re.search(r"^junction_ingest_events_total (\S+)$", text, re.M)
    num_events = int(float(events[1])) if events else 0
    return Sample(time.monotonic() - started, size, rows, largest(url, 3), num_events)


def largest(url: str, num: int = 6) -> str:
    """The `num` largest tables, their indexes and TOAST included."""
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r'"
            " AND relnamespace = 'public'::regnamespace ORDER BY 2 DESC LIMIT %s",
            (num,),
        ).fetchall()
    return ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in rows)


def pruned_rows(base: str) -> dict[str, int]:
    """The API's `junction_retention_rows_total`, by kind (empty: it does not prune)."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    found = re.findall(r'^junction_retention_rows_total\{kind="(\w+)"\} (\S+)$', text, re.M)
    return {kind: int(float(num)) for kind, num in found}


def prune_here(url: str, env: dict[str, str], stopping: threading.Event) -> dict[str, int]:
    """Retention rounds in this process (`--prune-here`), until `stopping`; their totals."""
    settings = Settings(
        _env_file=None,
        database_url=url,
        **{name.removeprefix("JUNCTION_").lower(): value for name, value in env.items()},
    )
    db = make_engine(settings.database_url)
    sessions, totals = make_sessionmaker(db), {}

    def run() -> None:
        while not stopping.wait(settings.retention_interval_s):
            pruned = retention.prune_round(db, sessions, settings)
            for kind, num in (pruned.by_kind() if pruned else {}).items():
                totals[kind] = totals.get(kind, 0) + num
        db.dispose()

    threading.Thread(target=run, daemon=True).start()
    return totals


def start_api(url: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """The soak's `junction api`: its retention settings in `env`, logging at info (the
    retention rounds it runs are counted from its log)."""
    return start_server(url, log, env, log_level="info")


def show(s: Sample) -> None:
    rows = "  ".join(f"{table} {num:>7,}" for table, num in s.rows.items())
    print(
        f"{s.elapsed_s:6.0f} s  size {s.size_bytes / 2**20:8.1f} MiB  {rows}  "
        f"events {s.num_events:>10,}  ({s.largest})",
        flush=True,
    )


def verdict(samples: list[Sample], duration: float) -> bool:
    """Whether the size levelled off: the last third's growth against the first third's."""

    def size_at(t: float) -> int:  # the median of the 3 samples nearest `t`: spikes aside
        near = sorted(samples, key=lambda s: abs(s.elapsed_s - t))[:3]
        return sorted(s.size_bytes for s in near)[len(near) // 2]

    first = size_at(duration / 3) - samples[0].size_bytes  # the first sample: the empty store
    last = size_at(duration) - size_at(2 * duration / 3)
    ok = last <= LEVEL_SHARE * max(first, 0)
    print(
        f"growth: first third {first / 2**20:+.1f} MiB, last third {last / 2**20:+.1f} MiB "
        f"({'levelled off' if ok else 'STILL GROWING'}: the last third may grow at most "
        f"{LEVEL_SHARE:.0%} of the first's)"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=900.0, help="seconds")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--steps", type=float, default=10.0, help="steps/s per engine")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--quick", action="store_true", help="90 s, a sample every 10 s")
    parser.add_argument("--prune-here", action="store_true", help="prune in this process")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.every = 90.0, 10.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up below on a kill too
    scratch = f"junction_soak_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{scratch}"
    env = retention_env(args.duration)
    server, drivers, stopping = None, [], threading.Event()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "api.log"
            server, base = start_api(url, env, log)
            pruner = "this process (--prune-here)" if args.prune_here else "the API's task"
            print(
                f"junction api (pid {server.pid}) at {base}, database {scratch}; "
                f"{args.engines} engines at {args.steps:g} steps/s each for "
                f"{args.duration:.0f} s; retention by {pruner}:\n  "
                + " ".join(f"{k.removeprefix('JUNCTION_')}={v}" for k, v in env.items()),
                flush=True,
            )
            here = prune_here(url, env, stopping) if args.prune_here else None
            started = time.monotonic()
            drivers = [Driver(base, index, args.steps) for index in range(args.engines)]
            samples = [sample(url, base, started)]
            show(samples[-1])
            while samples[-1].elapsed_s < args.duration - 1:
                time.sleep(max(0.0, min(args.every, args.duration - samples[-1].elapsed_s)))
                samples.append(sample(url, base, started))
                show(samples[-1])
            for driver in drivers:
                driver.stop()
            drivers = []
            stopping.set()
            print(f"largest tables: {largest(url)}")
            pruned = here if here is not None else pruned_rows(base)
            print(f"pruned: {pruned or 'nothing (no retention task ran)'}")
            rounds = log.read_text().count("retention pruned")
            if not args.prune_here:
                print(f"the API logged {rounds} retention rounds that pruned")
            return 0 if verdict(samples, args.duration) else 1
    finally:
        stopping.set()
        for driver in drivers:
            driver.stop()
        if server is not None:
            stop(server)
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
