"""`junction api`: the parser, and a real start that migrates an empty database first."""

from __future__ import annotations

import argparse
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from api.cli import add_api_parser, run_api
from api.guards.token import EXAMPLE_TOKEN

ROOT = Path(__file__).resolve().parents[2]  # the repository root

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


def start_api(cwd: Path, port: int, **env: str) -> subprocess.Popen:
    """`junction api` on `port` in `cwd`, with no JUNCTION_* setting but `env`, once healthy."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    clean |= {"JUNCTION_LOG_LEVEL": "warning", **env}
    clean["PYTHONPATH"] = str(ROOT)
    server = subprocess.Popen(
        [sys.executable, "-c", RUN_API, "api", "--port", str(port)],
        env=clean,
        cwd=cwd,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while True:
        assert server.poll() is None, "junction api exited"
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return server
        except httpx.TransportError:
            assert time.monotonic() < deadline, "junction api did not answer"
            time.sleep(0.1)


def stop(server: subprocess.Popen) -> str:
    """Stop it; what it printed."""
    server.terminate()
    out, _ = server.communicate(timeout=10)
    return out


def test_junction_api_migrates_then_serves(tmp_path: Path) -> None:
    port = free_port()
    database = {"JUNCTION_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    server = start_api(tmp_path, port, **database)
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.json() == {"status": "ok", "database": "sqlite"}
        # no JUNCTION_API_TOKEN: one was made, kept beside the SQLite store for its owner only
        kept = tmp_path / "junction-api-token"
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        token = kept.read_text().strip()
        assert len(token) >= 32
        auth = {"Authorization": f"Bearer {token}"}
        engines = f"http://127.0.0.1:{port}/api/v1/engines"
        assert httpx.get(engines, headers=auth).json() == []
        assert httpx.get(engines).status_code == 401
    finally:
        out = stop(server)
    assert f"made an API token and kept it in {kept}" in out and token not in out

    server = start_api(tmp_path, port, **database)  # a later start: the same token
    try:
        assert httpx.get(engines, headers=auth).json() == []
    finally:
        out = stop(server)
    assert f"the API token is the one kept in {kept}" in out and token not in out
    assert kept.read_text().strip() == token


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("", "JUNCTION_API_TOKEN is empty: set JUNCTION_API_TOKEN to a secret of at least 16"),
        ("   ", "JUNCTION_API_TOKEN is empty"),
        ("too-short", "JUNCTION_API_TOKEN has 9 characters, too few: set JUNCTION_API_TOKEN"),
        (EXAMPLE_TOKEN, "JUNCTION_API_TOKEN is the placeholder of .env.example"),
    ],
    ids=["empty", "blank", "short", "the example's"],
)
def test_a_token_it_refuses_stops_the_start(tmp_path: Path, token: str, says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    env |= {
        "JUNCTION_API_TOKEN": token,
        "JUNCTION_DATABASE_URL": f"sqlite:///{tmp_path / 'junction.db'}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "api", "--port", str(free_port())],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # one line that says what to do
    assert line.startswith("junction api: ") and says in line, line
    assert list(tmp_path.iterdir()) == []  # nothing migrated, no token file made


@pytest.mark.parametrize("command", ["migrate", "api"])
def test_an_unreachable_database_is_one_line_naming_the_url(tmp_path: Path, command: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    env |= {
        "JUNCTION_DATABASE_URL": "postgresql://junction:secret@127.0.0.1:1/nowhere",
        "JUNCTION_API_TOKEN": "a-token-long-enough-for-the-api-0",
        "JUNCTION_LOG_LEVEL": "warning",  # `junction api` logs its start at info
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", command, "--port", str(free_port())]
        if command == "api"
        else [sys.executable, "-m", "cli.main", command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()  # what is wrong, which URL, what to do
    assert line.startswith(f"junction {command}: cannot open the database "), line
    assert "JUNCTION_DATABASE_URL=postgresql+psycopg://junction:***@127.0.0.1:1/nowhere" in line
    assert "Connection refused" in line and "set JUNCTION_DATABASE_URL" in line
    assert "secret" not in done.stdout + done.stderr
