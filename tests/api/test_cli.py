"""`junction api`: the parser, and a real start that migrates an empty database first."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from api.cli import add_api_parser, run_api

RUN_API = (
    "import argparse, sys\n"
    "from api.cli import add_api_parser\n"
    "parser = argparse.ArgumentParser(prog='junction')\n"
    "add_api_parser(parser.add_subparsers(dest='command', required=True))\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "sys.exit(args.func(args))\n"
)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="junction")
    add_api_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_api_options() -> None:
    args = parser().parse_args(["api"])
    assert (args.host, args.port, args.func) == ("127.0.0.1", 8080, run_api)
    args = parser().parse_args(["api", "--host", "0.0.0.0", "--port", "9000"])
    assert (args.host, args.port) == ("0.0.0.0", 9000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_junction_api_migrates_then_serves(tmp_path: Path) -> None:
    port = free_port()
    env = os.environ | {
        "JUNCTION_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}",
        "JUNCTION_LOG_LEVEL": "warning",
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # the repository root
    server = subprocess.Popen(
        [sys.executable, "-c", RUN_API, "api", "--port", str(port)], env=env, cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, "junction api exited"
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "junction api did not answer"
                time.sleep(0.1)
        assert health.json() == {"status": "ok", "database": "sqlite"}
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/engines").json() == []
    finally:
        server.terminate()
        server.wait(10)
