"""`junction api` in its own process, for the end-to-end tests over real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
import openai

from tests.polling import wait_for
from tests.serve.conftest import text_prompt

TOKEN = "e2e-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 90  # a loaded 2-core machine starting several processes at once


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
    env: dict[str, str] = field(default_factory=dict)  # more JUNCTION_* settings

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "JUNCTION_DATABASE_URL": self.database_url,
            "JUNCTION_API_TOKEN": TOKEN,
            "JUNCTION_LOG_LEVEL": "warning",
            **self.env,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "api", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"junction api exited: {self.process.stderr.read().decode()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"junction api did not become healthy in {START_TIMEOUT_S} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def blocks(self, engine_id: str) -> list[dict]:
        """The block table as the engine's own rows: the store's say their tier too, always
        "device" in this table (checked, then left out)."""
        rows = self.all_blocks(engine_id, "blocks")
        assert all(row.pop("tier") == "device" for row in rows), "a block-table row off device"
        return rows

    def all_blocks(self, engine_id: str, route: str) -> list[dict]:
        """Every row of a paged block route (`blocks`, `peer-blocks`), page after page."""
        rows, offset = [], 0
        while True:
            page = httpx.get(
                f"{self.url}/api/v1/engines/{engine_id}/{route}",
                params={"offset": offset, "limit": 10000},
                headers=AUTH,
                timeout=30,
            ).json()
            rows.extend(page["blocks"])
            offset += len(page["blocks"])
            if offset >= page["total"] or not page["blocks"]:
                return rows


GEOMETRY = (
    "--block-size",
    "16",
    "--mamba-block-size",
    "512",
    "--prefix-match-unit",
    "16",
    "--num-blocks",
    "160",
    "--num-mamba-blocks",
    "32",
)


class Serve:
    """`junction serve` in its own process, streaming to `api` (`port`: restart on the same one)."""

    def __init__(
        self,
        api: ApiProcess,
        engine_id: str,
        *extra: str,
        runner: str = "torch",
        geometry: tuple[str, ...] = GEOMETRY,
        port: int | None = None,
        start_timeout_s: float = 60,
    ) -> None:
        self.engine_id = engine_id
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "JUNCTION_API_TOKEN": TOKEN}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "serve",
                "--port",
                str(self.port),
                "--runner",
                runner,
                "--device",
                "cpu",
                "--engine-id",
                engine_id,
                "--control-plane",
                api.url,
                "--token",
                TOKEN,
                "--log-level",
                "warning",
                *geometry,
                *extra,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{self.port}"

        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(self.process.stderr.read().decode())
            try:
                return httpx.get(f"{base}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("junction serve", healthy, start_timeout_s)
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        wait_for(
            "the engine to connect",
            lambda: api_engine(api, engine_id).get("connected"),
            start_timeout_s,
        )

    def ask(self, prompt: str) -> int:
        """Sends one completion; returns its hit length (cached prompt tokens)."""
        done = self.client.completions.create(
            model="junction-hybrid-tiny", prompt=prompt, max_tokens=1, temperature=0
        )
        return done.usage.prompt_tokens_details.cached_tokens

    def flood(self, seed: int, num: int = 12) -> None:
        for i in range(num):
            self.ask(text_prompt(seed * 100 + i, 700))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


def api_engine(api: ApiProcess, engine_id: str) -> dict:
    response = httpx.get(f"{api.url}/api/v1/engines/{engine_id}", headers=AUTH, timeout=5)
    return response.json() if response.status_code == 200 else {}


def pin_state(api: ApiProcess, pin_id: str, engine_id: str) -> str | None:
    pin = httpx.get(f"{api.url}/api/v1/pins/{pin_id}", headers=AUTH, timeout=5).json()
    for target in pin["engines"]:
        if target["engine_id"] == engine_id:
            return target["state"]
    return None
