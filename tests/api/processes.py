"""`junction api` in its own process, for the end-to-end tests over real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

TOKEN = "e2e-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ApiProcess:
    """`junction api` in its own process, restartable on the same database and port."""

    database_url: str
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "JUNCTION_DATABASE_URL": self.database_url,
            "JUNCTION_API_TOKEN": TOKEN,
            "JUNCTION_LOG_LEVEL": "warning",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "api", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"junction api exited: {self.process.stderr.read().decode()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("junction api did not become healthy in 30 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def blocks(self, engine_id: str) -> list[dict]:
        rows, offset = [], 0
        while True:
            page = httpx.get(
                f"{self.url}/api/v1/engines/{engine_id}/blocks",
                params={"offset": offset, "limit": 10000},
                timeout=30,
            ).json()
            rows.extend(page["blocks"])
            offset += len(page["blocks"])
            if offset >= page["total"] or not page["blocks"]:
                return rows
