"""Issue 47, items 15 and 20: what `junction up` prints to a newcomer. "Junction is up" comes
once the control plane has accepted the engine (its `/health` answered seconds before); no
alembic INFO lines and no Celery banners (they came after the URLs); and Ctrl-C stops every
part with "stopped", not "exit code -15" for the parts uvicorn serves. A real `junction up`
(null runner, worker and beat), as `make run` starts it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.api.processes import free_port
from tests.polling import wait_for
from tests.stack.test_up import Up

ROOT = Path(__file__).parents[2]
#: Lines only Celery's banners print (the worker's, then beat's).
BANNERS = ("-------------- celery@", "[config]", "[tasks]", "LocalTime ->", "Configuration ->")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


def test_up_says_up_once_the_engine_is_accepted_and_keeps_quiet(tmp_path: Path) -> None:
    ports = {"api": free_port(), "engine": free_port(), "dashboard": free_port()}
    up = Up(
        tmp_path,
        *("--api-port", str(ports["api"]), "--engine-port", str(ports["engine"])),
        *("--dashboard-port", str(ports["dashboard"]), "--runner", "null"),
        JUNCTION_LOG_LEVEL="info",  # as `make run` has it
        PYTHONPATH=str(ROOT),  # this tree's code, though it runs in `tmp_path`
    )
    try:
        up.wait_for_line("URLs", lambda line: line == "Junction is up:", 240)
        token = (tmp_path / "junction-api-token").read_text().strip()
        engine = httpx.get(
            f"http://127.0.0.1:{ports['api']}/api/v1/engines/engine-0",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert engine.status_code == 200 and engine.json()["connected"], up.log[-3000:]
        lines = up.lines
        accepted = next(
            i for i, line in enumerate(lines) if "accepted by the control plane" in line
        )
        assert accepted < lines.index("Junction is up:")
        # worker and beat past where their banners were printed: beat keeps its schedule file,
        # the worker has forked its pool
        pids = up.pids()
        wait_for("beat's schedule file", lambda: any(tmp_path.glob("celerybeat-schedule*")), 60)
        wait_for("the worker's pool", lambda: len(children(pids["worker"])) >= 2, 60)
        time.sleep(1)  # what they print at start, printed
    finally:
        code = up.interrupt()
    log = up.log
    assert code == 0, log[-4000:]
    assert "alembic" not in log, log[:3000]
    assert not [line for line in up.lines if any(b in line for b in BANNERS)], log
    assert "exit code" not in log, log[-3000:]
    for part in ("api", "engine", "dashboard", "worker", "beat"):
        assert f"{part:>9} | stopped" in log, log[-3000:]
