"""`.gitignore` ignores every file a local start (`make run`) leaves in the working directory:
what a real `junction api` leaves there, and the other parts' default stores."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from api.settings import Settings
from tests.api.processes import free_port
from tests.api.test_cli import start_api, stop

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="no git checkout here"
)


def not_ignored(paths: set[str]) -> set[str]:
    """The paths (relative to the repository root) `.gitignore` does not ignore."""
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(sorted(paths)) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: none of them ignored
    return paths - set(done.stdout.splitlines())


def test_gitignore_ignores_what_a_local_start_leaves(tmp_path: Path) -> None:
    stop(start_api(tmp_path, free_port()))  # the defaults: the SQLite store ./junction.db
    left = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {"junction.db", "junction-api-token", "junction.db-replica.lock"} <= left
    fields = Settings.model_fields
    for name in ("broker_url", "result_backend"):  # the worker's and the beat's stores
        database = make_url(fields[name].default).database
        left |= {Path(database).name, f"{Path(database).name}-wal"}
    left |= {"celerybeat-schedule", "celerybeat-schedule.db", ".venv/.installed"}
    assert not_ignored(left) == set()
