"""What a consumer waits for beside heavy readers: `GET /api/v1/events` and `/healthz`.

A `junction api` on a scratch PostgreSQL database, an engine's events streamed into it until
`--events` are stored, then `--readers` threads reading what a dashboard reads (a 1000-row
block-table page, requests, the hit rate: `benchmarks/ingest.py`'s `Readers`) as fast as the
API answers, while one consumer asks for the engine's next events and the health check in
turn for `--duration` s. Prints the median and p99 of each answer's time, and the readers'
rate. Issue 31, item 11: with one lane for every read, events lagged 13.6 s p99 and /healthz
6 s beside 50 readers.

    .venv/bin/python benchmarks/read_lanes.py [--readers 50] [--duration 20] [--events 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from ingest import ADMIN_URL, AUTH, Readers, Workload, flush, percentiles, start_server, stop


def fill(base: str, num_events: int) -> str:
    """Stream an engine's events into the store until `num_events` are stored; its id."""
    work = Workload(f"bench-lanes-{uuid.uuid4().hex[:6]}")
    publisher = work.publish(base, binary=True)
    while work.num_events < num_events:
        work.step()
    flush(publisher)
    publisher.close()
    return work.engine.engine_id


def consume(base: str, engine_id: str, duration_s: float) -> dict[str, list[float]]:
    """Seconds each answer took: the next page of events, then /healthz, in turn."""
    seconds: dict[str, list[float]] = {"events": [], "healthz": [], "events 503": []}
    params = {"engine_id": engine_id, "after_seq": -1, "limit": 100}
    with httpx.Client(base_url=base, headers=AUTH, timeout=120) as client:
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            start = time.perf_counter()
            page = client.get("/api/v1/events", params=params)
            took = time.perf_counter() - start
            if page.status_code == 503:
                seconds["events 503"].append(took)
            else:
                page.raise_for_status()
                seconds["events"].append(took)
                batches = page.json()["batches"]
                params["after_seq"] = batches[-1]["seq"] if batches else -1  # then from start
            start = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            seconds["healthz"].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    scratch = f"junction_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{scratch}"
            server, base = start_server(url, Path(tmp) / "api.log")
            engine_id = fill(base, args.events)
            readers = Readers(base, engine_id, args.readers)
            time.sleep(1)  # the readers at full speed
            started = time.perf_counter()
            seconds = consume(base, engine_id, args.duration)
            read_s = time.perf_counter() - started
            readers.stop()
    finally:
        if server is not None:
            stop(server)
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    print(
        f"beside {args.readers} readers ({readers.num_reads / read_s:,.0f} reads/s, "
        f"{readers.num_busy:,} answered 503), {args.duration:g} s:"
    )
    for name in ("events", "healthz"):
        p50, p99 = percentiles(seconds[name])
        print(
            f"  {name:8} {len(seconds[name]):5,} answers: p50 {p50 * 1e3:,.0f} ms, "
            f"p99 {p99 * 1e3:,.0f} ms"
        )
    if seconds["events 503"]:
        print(f"  events answered 503 (no read slot): {len(seconds['events 503']):,}")


if __name__ == "__main__":
    main()
