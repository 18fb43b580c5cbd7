"""`junction up` end to end: what `make run` starts, on free ports and the embedded defaults
(SQLite store, Celery on its SQLAlchemy transport, no JUNCTION_API_TOKEN: the token it makes
and keeps), used the way a newcomer would: requests through the official `openai` client, a
pin and a benchmark through the REST API with the token from its file, all found again
through the REST API; then SIGINT, and every process it started has exited."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai

from tests.api.processes import free_port
from tests.jobs.specs import tiny_spec
from tests.polling import wait_for
from tests.serve.conftest import text_prompt

SYSTEM = text_prompt(11, 300)


class Up:
    def __init__(self, cwd: Path, *args: str, **settings: str) -> None:
        self.lines: list[str] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
        # this tree's code: `cwd` is a scratch folder, where `-m cli.main` would import the
        # installed checkout's instead
        root = str(Path(__file__).parents[2])
        env |= {"JUNCTION_LOG_LEVEL": "warning", "PYTHONPATH": root, **settings}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def interrupt(self) -> int:
        """Ctrl-C, as a user stops it; its exit code (killed, and raised, after 90 s)."""
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def pids(self) -> dict[str, int]:
        found = (re.search(r"^\s*([\w-]+) \| started \(pid (\d+)\)", line) for line in self.lines)
        return {m.group(1): int(m.group(2)) for m in found if m}

    def wait_for_line(self, what: str, check: Callable[[str], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(check(line) for line in list(self.lines)):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"junction up: no {what}; its output:\n{self.log[-6000:]}")


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_junction_up_runs_everything_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    ports = {"api": free_port(), "engine": free_port(), "dashboard": free_port()}
    up = Up(
        tmp_path,
        *("--api-port", str(ports["api"]), "--engine-port", str(ports["engine"])),
        *("--dashboard-port", str(ports["dashboard"]), "--device", "cpu"),
    )
    api = f"http://127.0.0.1:{ports['api']}"
    try:
        up.wait_for_line("URLs", lambda line: line == "Junction is up:", 240)
        assert f"http://127.0.0.1:{ports['dashboard']}" in up.log
        assert set(up.pids()) == {"api", "engine", "dashboard", "worker", "beat"}
        assert (tmp_path / "junction.db").exists()  # the embedded store, migrated
        kept = tmp_path / "junction-api-token"  # no JUNCTION_API_TOKEN: made, beside the store
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        token = kept.read_text().strip()
        up.wait_for_line("the token's file", lambda line: f"API token  {kept}" in line, 10)
        assert token not in up.log
        auth = {"Authorization": f"Bearer {token}"}

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['engine']}/v1", api_key="x")
        for i in range(3):
            client.completions.create(
                model="junction-hybrid-tiny", prompt=SYSTEM + text_prompt(i, 40), max_tokens=2
            )
        wait_for(
            "the requests in the store",
            lambda: (
                httpx.get(f"{api}/api/v1/engines/engine-0/requests", headers=auth).json()["total"]
                == 3
            ),
        )
        pin = httpx.post(
            f"{api}/api/v1/pins",
            headers=auth,
            json={"prefix": {"text": SYSTEM}, "label": "system"},
            timeout=10,
        )
        assert pin.status_code == 201, pin.text

        def pin_materialized() -> bool:
            body = httpx.get(f"{api}/api/v1/pins/{pin.json()['pin_id']}", headers=auth).json()
            return [e["state"] for e in body["engines"]] == ["materialized"]

        wait_for("the pin to materialize", pin_materialized)
        run = httpx.post(f"{api}/api/v1/benchmarks", headers=auth, json=tiny_spec(), timeout=10)
        assert run.status_code == 201, run.text

        def run_status() -> str:
            url = f"{api}/api/v1/benchmarks/{run.json()['id']}"
            return httpx.get(url, headers=auth).json()["status"]

        wait_for("the benchmark run to finish", lambda: run_status() in ("finished", "failed"), 180)
        finished = httpx.get(f"{api}/api/v1/benchmarks/{run.json()['id']}", headers=auth).json()
        assert finished["status"] == "finished", finished["error"]
        assert [m["mode"] for m in finished["results"]["modes"]] == tiny_spec()["modes"]
        dashboard = httpx.get(f"http://127.0.0.1:{ports['dashboard']}/_stcore/health")
        assert dashboard.status_code == 200
    finally:
        pids = up.pids()
        code = up.interrupt()
    assert code == 0, up.log[-4000:]
    assert "every part stopped" in up.log
    deadline = time.monotonic() + 10
    while any(is_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in pids.items() if is_alive(pid)], up.log[-4000:]


def test_junction_up_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "up", "--api-port", str(taken)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"port {taken} (api)" in done.stderr and "--api-port" in done.stderr
    assert "started" not in done.stdout and not (tmp_path / "junction.db").exists()


def test_junction_up_refuses_an_empty_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "up", "--api-port", str(free_port())],
        cwd=tmp_path,
        env=env | {"JUNCTION_API_TOKEN": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("junction up: JUNCTION_API_TOKEN is empty: set JUNCTION_API_TOKEN")
    assert "started" not in done.stdout and list(tmp_path.iterdir()) == []  # nothing at all
