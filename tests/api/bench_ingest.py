"""Ingest throughput into a scratch database, with a ledger engine's real events.

    .venv/bin/python -m tests.api.bench_ingest [--sqlite] [--requests 400] [--batch-size 200]
        [--json] [--repeat 3] [--admin-url postgresql://postgres@127.0.0.1:5432/postgres]

Three rates, best of `--repeat` runs (each a new epoch of the same engine):
`apply`: `apply_batch` on decoded batches; `decode+apply`: from the frame's bytes, as the
socket does; `socket`: through uvicorn and a `websockets` client streaming without waiting
for acks. PostgreSQL gets a database `junction_bench_<hex>`, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from websockets.asyncio.client import connect

from api import migrate
from api.db import make_engine, make_sessionmaker
from api.ingest import apply_batch, apply_hello
from engine.wire import decode, encode
from tests.api import factories


def bench(url: str, num_requests: int, batch_size: int, binary: bool, repeat: int) -> None:
    engine = factories.run_engine("bench", num_requests=num_requests, num_prefixes=8)
    events = factories.event_dicts(engine)
    num_rows = sum(len(e["blocks"]) for e in events if e["type"] == "BlockStateChanged")
    print(f"{len(events)} events ({num_rows} block rows) in batches of {batch_size}")
    migrate.upgrade(url)
    db = make_engine(url)
    sessions = make_sessionmaker(db)
    epochs = iter(range(engine.epoch, engine.epoch + 10 * repeat))

    def run(decoded: bool) -> float:
        epoch = next(epochs)
        hello = factories.parse(factories.hello(engine, epoch))
        frames = [encode(b, binary) for b in factories.batches(engine, events, batch_size, epoch)]
        with sessions() as session:
            apply_hello(session, hello)
        batches = [decode(f) for f in frames] if decoded else frames
        started = time.perf_counter()
        for item in batches:
            with sessions() as session:
                apply_batch(session, hello, item if decoded else decode(item))
        return time.perf_counter() - started

    kind = f"{url.split(':')[0]}, {'msgpack' if binary else 'JSON'}"
    for name, decoded in (("apply", True), ("decode+apply", False)):
        elapsed = min(run(decoded) for _ in range(repeat))
        print(f"{kind}: {name}: {len(events) / elapsed:,.0f} events/s ({elapsed:.2f}s)")
    db.dispose()
    elapsed = min(
        socket_run(url, engine, events, batch_size, binary, next(epochs)) for _ in range(repeat)
    )
    print(f"{kind}: socket: {len(events) / elapsed:,.0f} events/s ({elapsed:.2f}s)")


def socket_run(url, engine, events, batch_size, binary, epoch) -> float:
    """Stream to a `junction api`-like server in a process of its own (as deployed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = os.environ | {"JUNCTION_DATABASE_URL": url, "JUNCTION_API_TOKEN": "bench"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "api.main:create_app",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--ws-max-size",
            str(1 << 25),
        ],
        env=env,
    )
    frames = [encode(b, binary) for b in factories.batches(engine, events, batch_size, epoch)]

    async def stream() -> float:
        headers = {"Authorization": "Bearer bench"}
        uri = f"ws://127.0.0.1:{port}/api/v1/ingest"
        for _ in range(200):
            try:
                ws = await connect(uri, additional_headers=headers, max_size=None)
                break
            except OSError:
                await asyncio.sleep(0.05)
        async with ws:
            await ws.send(encode(factories.hello(engine, epoch), binary))
            await ws.recv()
            started = time.perf_counter()

            async def send_all() -> None:
                for frame in frames:
                    await ws.send(frame)

            sender = asyncio.create_task(send_all())
            for _ in frames:
                await ws.recv()
            await sender
            return time.perf_counter() - started

    try:
        return asyncio.run(stream())
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="JSON frames (default msgpack)")
    args = parser.parse_args()
    options = (args.requests, args.batch_size, not args.json, args.repeat)
    if args.sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            bench(f"sqlite:///{Path(tmp) / 'bench.db'}", *options)
        return
    name = f"junction_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = args.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
        bench(f"{base}/{name}", *options)
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
