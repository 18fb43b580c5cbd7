"""Idle sockets cannot keep requests out of the router or the engine's OpenAI port (issue 47,
item 5): each runs under an open-file limit of 192 while 400 sockets that never send a byte
are held open against it (from 8 loopback addresses, so no per-IP bound hides the point).
Before, neither had a bound: the idle sockets took every file, accept() failed, and no
request was answered. Now both serve `protocol.connections.guarded.GuardedProtocol`, whose
connection bound is lowered to what the open-file limit leaves, and a new connection closes
an idle one to take its place."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.api.processes import free_port
from tests.router.processes import MODEL, TOKEN, Process, child_env

OPEN_FILES = 192
NUM_IDLE = 400


def low_open_files() -> None:
    """Run in the child before it starts: `ulimit -n 192`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, hard))


@contextmanager
def limited(what: str, args: list[str], log: Path) -> Iterator[Process]:
    port = free_port()
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args, "--port", str(port)],
            env=child_env(JUNCTION_API_TOKEN=TOKEN),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=low_open_files,
        )
    process = Process(what, child, port, log)
    try:
        process.wait_healthy()
        yield process
    finally:
        process.stop()


@contextmanager
def idle_sockets(port: int) -> Iterator[list[socket.socket]]:
    held = []
    try:
        for n in range(NUM_IDLE):
            source = (f"127.0.0.{2 + n % 8}", 0)
            held.append(socket.create_connection(("127.0.0.1", port), 5, source))
        yield held
    finally:
        for sock in held:
            sock.close()


def test_idle_sockets_under_the_open_file_limit_keep_no_request_out(tmp_path: Path) -> None:
    serve = ["serve", "--runner", "null", "--device", "cpu", "--log-level", "warning"]
    with limited("junction serve", serve, tmp_path / "engine.log") as engine:
        route = ["route", "--engine", engine.url, "--log-level", "warning"]
        with limited("junction route", route, tmp_path / "router.log") as router:
            with idle_sockets(router.port), idle_sockets(engine.port):
                statuses = []
                for n in range(8):
                    try:
                        answer = httpx.post(
                            f"{router.url}/v1/completions",
                            json={"model": MODEL, "prompt": f"hello {n}", "max_tokens": 2},
                            timeout=5,
                        )
                        statuses.append(answer.status_code)
                        statuses.append(httpx.get(f"{engine.url}/health", timeout=5).status_code)
                    except httpx.HTTPError as exc:
                        statuses.append(type(exc).__name__)
                        break
    assert statuses == [200] * 16, statuses
