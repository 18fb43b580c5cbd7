"""`junction worker` in its own process (solo pool by default: one process), its log in a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

READY = "ready."
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    env: dict[str, str]
    log_path: Path
    pool: str = "solo"
    concurrency: int = 1
    process: subprocess.Popen | None = None
    name: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:8]}@jobs")

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", "--pool", self.pool]
            + [
                "--concurrency",
                str(self.concurrency),
                "--loglevel",
                "info",
                "--hostname",
                self.name,
            ],
            env={**os.environ, "PYTHONPATH": pythonpath(), **self.env},
            cwd=self.log_path.parent,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if READY in self.log():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"junction worker exited:\n{self.log()}")
            time.sleep(0.1)
        raise RuntimeError(f"junction worker not ready in {timeout_s:g} s:\n{self.log()}")

    def child_pids(self) -> list[int]:
        """The pool's processes (prefork), from Linux's /proc."""
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def pythonpath() -> str:
    """The repository first: it runs in a scratch directory, and the checkout's packages may
    be newer than the editable install's list of them."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
