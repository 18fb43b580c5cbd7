"""`junction pin` / `unpin` / `pins` against a live uvicorn app, with a ledger engine on a real
websocket applying the pin commands it is sent."""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from websockets.sync.client import ClientConnection, connect

from client.pins_cli import add_pin_parsers, call
from engine.config import CacheConfig
from engine.engine import Engine
from engine.wire import Command, encode
from publish.commands import apply_command
from tests.api import factories
from tests.api.conftest import TOKEN

SYSTEM = "You are the Junction test assistant. Answer in one short sentence. " * 2


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="junction")
    add_pin_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


class SocketEngine:
    """A ledger engine on the ingest socket of a real server (the `websockets` client)."""

    def __init__(self, server: str, engine_id: str, **cache) -> None:
        config = {"block_size": 16, "mamba_block_size": 512, "num_blocks": 256} | cache
        self.engine = Engine(CacheConfig(**config), runner="ledger", engine_id=engine_id)
        self.server = server
        url = server.replace("http://", "ws://") + "/api/v1/ingest"
        self.ws: ClientConnection = connect(
            url, additional_headers={"Authorization": f"Bearer {TOKEN}"}
        ).__enter__()  # closed by the test
        self.ws.send(encode(factories.hello(self.engine)))
        self.seq = json.loads(self.ws.recv(timeout=10))["next_seq"]
        self.num_sent = 0

    def answer(self) -> dict:
        """Take the next command, apply it, and stream the events it made (up to the ack)."""
        command = json.loads(self.ws.recv(timeout=10))
        assert command["type"] == "command", command
        apply_command(self.engine, msgspec.convert(command, Command))
        self.engine.run_until_done()
        events = [e.to_dict() for e in self.engine.sink.events[self.num_sent :]]
        self.num_sent += len(events)
        batch = {
            "type": "batch",
            "engine_id": self.engine.engine_id,
            "epoch": self.engine.epoch,
            "seq": self.seq,
            "ts": time.time(),
            "events": events,
        }
        self.ws.send(encode(batch))
        assert json.loads(self.ws.recv(timeout=10)) == {"type": "ack", "seq": self.seq}
        self.seq += 1
        blocks = httpx.get(
            f"{self.server}/api/v1/engines/{self.engine.engine_id}/blocks",
            params={"limit": 10_000},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()["blocks"]
        factories.assert_same_table(factories.table(blocks), self.engine)  # both ways
        return command


def test_pin_pins_unpin(server: str, capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", server)
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    good = SocketEngine(server, "cli-good")
    bare = SocketEngine(server, "cli-bare", enable_prefix_caching=False)
    try:
        code, out, err = run(capsys, "pin", "--text", SYSTEM, "--label", "system prompt")
        assert (code, err) == (0, "")
        pin_id = out.split()[1]
        assert out == (
            f"pinned {pin_id} (system prompt): {len(SYSTEM)} tokens, "
            f"boundary cli-bare 128, cli-good 128; pending\n"
        )
        assert good.answer()["payload"]["pin_id"] == pin_id
        assert bare.answer()["payload"]["pin_id"] == pin_id

        prompt = tmp_path / "prompt.txt"
        prompt.write_text(SYSTEM[:50])
        code, out, _ = run(
            capsys, "pin", "--file", str(prompt), "--label", "from a file",
            "--engine", "cli-good", "--priority", "3", "--json",
        )  # fmt: skip
        second = json.loads(out)
        assert (code, second["num_tokens"], second["targets"], second["priority"]) == (
            0,
            50,
            ["cli-good"],
            3,
        )
        assert good.answer()["payload"]["token_ids"] == list(SYSTEM[:50].encode())

        code, out, _ = run(capsys, "pins")
        lines = out.splitlines()
        assert code == 0 and lines[0].split() == [
            "PIN", "LABEL", "TOKENS", "PRIORITY", "STATE", "HITS", "SAVED", "REASON",
        ]  # fmt: skip
        assert lines[1].split()[:5] == [second["pin_id"], "from", "a", "file", "50"]
        assert lines[2].split() == ["cli-good", "boundary", "48", "materialized", "0", "0"]
        assert lines[3].split()[:4] == [pin_id, "system", "prompt", str(len(SYSTEM))]
        assert lines[4].split() == [
            "cli-bare", "boundary", "128", "failed", "0", "0",
            "prefix", "caching", "is", "off", "on", "this", "engine",
        ]  # fmt: skip
        assert lines[5].split() == ["cli-good", "boundary", "128", "materialized", "0", "0"]

        code, out, _ = run(capsys, "unpin", pin_id)
        assert (code, out) == (0, f"released {pin_id} (system prompt)\n")
        assert good.answer() == {
            "type": "command",
            "command": "unpin",
            "payload": {"pin_id": pin_id},
        }
        code, out, _ = run(capsys, "pins", "--state", "released", "--json")
        assert [pin["pin_id"] for pin in json.loads(out)] == [pin_id]
    finally:
        good.ws.close()
        bare.ws.close()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["pin", "--text", "tiny", "--label", "x", "--engine", "cli-e1"],
            2,
            "junction pin: POST /pins: HTTP 422: the prefix's 4 tokens floor to a boundary of 0 "
            "on engine 'cli-e1''s 16-token hit grid",
        ),
        (
            ["pin", "--text", SYSTEM, "--label", "x", "--engine", "ghost"],
            2,
            "junction pin: POST /pins: HTTP 404: engine 'ghost' not found",
        ),
        (
            ["pin", "--text", "", "--label", "x"],
            2,
            "HTTP 422: prefix: the prefix is empty (text has no tokens)",
        ),
        (
            ["pin", "--segments", '[{"seed": 1, "len": -3}]', "--label", "x"],
            2,
            "HTTP 422: prefix.segments[0].len: must be greater than 0, got -3: send a larger value",
        ),
        (["pin", "--token-ids", "1,two", "--label", "x"], 2, "comma-separated integers"),
        (["pin", "--segments", "[{", "--label", "x"], 2, "--segments is not valid JSON"),
        (["unpin", "pin-nope"], 2, "junction unpin: DELETE /pins/pin-nope: HTTP 404: pin "),
        (
            ["unpin", "pin-nope", "--token", "wrong"],
            2,
            "junction unpin: DELETE /pins/pin-nope: HTTP 401: wrong bearer token",
        ),
    ],
    ids=[
        "boundary 0",
        "unknown engine",
        "empty",
        "bad segment",
        "bad token ids",
        "bad json",
        "unknown pin",
        "wrong token",
    ],
)
def test_refusals_print_the_apis_message(
    server: str, capsys, monkeypatch, argv: list[str], code: int, message: str
) -> None:
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    engine = SocketEngine(server, "cli-e1")
    try:
        got, out, err = run(capsys, *argv, "--control-plane", server)
    finally:
        engine.ws.close()
    assert (got, out) == (code, "")
    assert message in err, err


def test_an_unreachable_control_plane_is_named(capsys, monkeypatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", url)
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    code, out, err = run(capsys, "pins")
    assert (code, out) == (1, "")
    assert err.startswith(f"junction pins: cannot reach the control plane at {url}: ")


def test_the_token_and_url_default_from_the_environment(capsys, monkeypatch) -> None:
    monkeypatch.delenv("JUNCTION_CONTROL_PLANE_URL", raising=False)
    parser = argparse.ArgumentParser(prog="junction")
    add_pin_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pin", "--token-ids", "1,2,3", "--label", "x", "--engine", "a"])
    assert (args.token_ids, args.engine_ids, args.priority) == ("1,2,3", ["a"], 0)
    with pytest.raises(SystemExit):
        parser.parse_args(["pin", "--text", "a", "--token-ids", "1", "--label", "x"])
    seen = []
    monkeypatch.setattr(
        "httpx.request",
        lambda method, url, **kw: seen.append((url, kw)) or httpx.Response(200, json=[]),
    )
    monkeypatch.setenv("JUNCTION_API_TOKEN", "from-env")
    call(parser.parse_args(["pins"]), "GET", "/pins")
    assert seen[0][0] == "http://127.0.0.1:8080/api/v1/pins"
    assert seen[0][1]["headers"] == {"Authorization": "Bearer from-env"}


@pytest.mark.parametrize(
    ("argv", "tokens"),
    [
        (["pins"], "JUNCTION_API_TOKEN (or JUNCTION_READ_TOKEN)"),
        (["unpin", "pin-x"], "JUNCTION_API_TOKEN"),
        (["pin", "--text", "x", "--label", "x"], "JUNCTION_API_TOKEN"),
    ],
    ids=["pins", "unpin", "pin"],
)
def test_without_a_token_the_commands_say_which_to_set(
    capsys, monkeypatch, tmp_path, argv: list[str], tokens: str
) -> None:
    for name in ("JUNCTION_API_TOKEN", "JUNCTION_READ_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    kept = tmp_path / "the-token"
    monkeypatch.setenv("JUNCTION_API_TOKEN_FILE", str(kept))
    code, out, err = run(capsys, *argv, "--control-plane", "http://127.0.0.1:9")
    assert (code, out) == (2, "")
    assert err == (
        f"junction {argv[0]}: no token to send: pass --token or set {tokens} to the control "
        f"plane's; a control plane started here keeps the one it made in {kept}\n"
    )
    kept.write_text("k7-made-0123456789\n")  # `junction up` made one (issue 47, item 20)
    code, out, err = run(capsys, *argv, "--control-plane", "http://127.0.0.1:9")
    assert code == 2
    assert f"export JUNCTION_API_TOKEN=$(cat {kept})" in err


def test_pins_reads_with_the_read_token(server: str, capsys, monkeypatch) -> None:
    monkeypatch.delenv("JUNCTION_API_TOKEN", raising=False)
    monkeypatch.setenv("JUNCTION_READ_TOKEN", TOKEN)  # the server's write token reads too
    code, out, err = run(capsys, "pins", "--control-plane", server)
    assert (code, out, err) == (0, "no pins\n", "")


def fake_pin(number: int) -> dict:
    """A pin as `GET /pins` answers one (`api.schemas.PinOut`), on three engines."""
    target = {"boundary": 64, "state": "materialized", "num_hits": 3, "tokens_saved": 9}
    target |= {"reason": None, "keys": {}, "block_ids": {}, "updated_at": "2026-01-01T00:00:00"}
    return {
        "pin_id": f"pin-{number:05d}",
        "label": f"system prompt {number}",
        "origin": "api",
        "targets": "all",
        "num_tokens": 640,
        "priority": 0,
        "state": "materialized",
        "boundary": {f"e{i}": 64 for i in range(3)},
        "num_hits": 3,
        "tokens_saved": 1920,
        "engines": [target | {"engine_id": f"e{i}"} for i in range(3)],
        "created_at": "2026-01-01T00:00:00",
        "released_at": None,
    }


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_pins_into_a_closed_pipe_leaves_no_traceback(tmp_path: Path, json_flag) -> None:
    """`junction pins | head -c 1`: far more than a pipe holds (64 KiB), the reader gone."""
    import os
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps([fake_pin(n) for n in range(2000)]).encode()

    class Pins(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    stub = ThreadingHTTPServer(("127.0.0.1", 0), Pins)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{stub.server_address[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    try:
        junction = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "pins", "--control-plane", url, *json_flag],
            cwd=tmp_path,
            env=env | {"JUNCTION_API_TOKEN": TOKEN},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        head = subprocess.run(["head", "-c", "1"], stdin=junction.stdout, capture_output=True)
        junction.stdout.close()  # only `head` holds the pipe's read end now
        err = junction.stderr.read().decode()
        code = junction.wait(timeout=60)
    finally:
        stub.shutdown()
    assert head.stdout in (b"P", b"[")
    assert (code, err) == (0, "")
