"""Ingest beside dashboard-like readers, with the read limit and without it, in one run.

For each `--read-caps` value, a `junction api` on a scratch PostgreSQL database with
`JUNCTION_MAX_CONCURRENT_READS` set to it (4, the default; 1000, in effect no limit), an engine
streaming at `--rate` events/s for `--duration` s while `--readers` threads read what a
dashboard reads (a 1000-row block-table page, requests, the hit rate) as fast as the API
answers. Prints each run's lags (`benchmarks/ingest.py`'s: a batch made until the store
committed it, and until a reader of `/api/v1/events` saw it) and the ratios of the p99s.

    .venv/bin/python benchmarks/readers.py [--readers 50] [--rate 5000] [--duration 10]
        [--read-caps 4 1000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path

import psycopg
from ingest import ADMIN_URL, lag, start_server, stop  # beside this file


def run(cap: int, args: argparse.Namespace) -> dict[str, float]:
    scratch = f"junction_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    os.environ["JUNCTION_MAX_CONCURRENT_READS"] = str(cap)
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{scratch}"
            server, base = start_server(url, Path(tmp) / "api.log")
            print(f"JUNCTION_MAX_CONCURRENT_READS={cap}:", flush=True)
            return lag(base, args.rate, args.duration, readers=args.readers)
    finally:
        if server is not None:
            stop(server)
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--rate", type=int, default=5_000)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--read-caps", type=int, nargs="+", default=[4, 1000])
    args = parser.parse_args()
    p99s = {cap: run(cap, args) for cap in args.read_caps}
    first = p99s[args.read_caps[0]]
    for cap, p99 in p99s.items():
        print(
            f"read cap {cap:>5}: committed p99 {p99['committed'] * 1e3:,.0f} ms "
            f"({p99['committed'] / first['committed']:.2f}x), visible to a reader p99 "
            f"{p99['visible'] * 1e3:,.0f} ms ({p99['visible'] / first['visible']:.2f}x)"
        )


if __name__ == "__main__":
    main()
