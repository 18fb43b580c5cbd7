"""`junction serve` engines and a `junction route` in front of them, each in its own process,
for the router's end-to-end tests. Nothing here is a stand-in: every process is the real one,
started as a user would, its stderr kept in a file so that a failed start says why."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from tests.api.processes import START_TIMEOUT_S, free_port
from tests.polling import wait_for

TOKEN = "router-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "junction-hybrid-tiny"


def child_env(**settings: str) -> dict[str, str]:
    """The environment without any `JUNCTION_*` setting of the caller's, plus `settings`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")} | settings


def junction(*args: str, log: Path, **settings: str) -> subprocess.Popen:
    """`junction ARGS` in its own process, its stdout and stderr into `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            env=child_env(**settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


class Process:
    """A started `junction` command, its base URL and its log."""

    def __init__(self, what: str, process: subprocess.Popen, port: int, log: Path) -> None:
        self.what = what
        self.process = process
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.what} exited: {self.log.read_text()}")
            try:
                return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(f"{self.what} to answer /health", healthy, timeout_s)

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="x", max_retries=0)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to say goodbye."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_engine(
    log_dir: Path, engine_id: str, *extra: str, runner: str = "null", token: str | None = TOKEN
) -> Process:
    """`junction serve` (not waited for: start several, then `wait_healthy` each); `token`
    None starts it without one, so it serves no cache feed."""
    port = free_port()
    args = ["serve", "--port", str(port), "--runner", runner, "--device", "cpu"]
    args += ["--engine-id", engine_id, "--log-level", "warning", *extra]
    settings = {"JUNCTION_API_TOKEN": token} if token else {}
    log = log_dir / f"engine-{engine_id}.log"
    return Process(f"junction serve {engine_id}", junction(*args, log=log, **settings), port, log)


def start_router(
    log_dir: Path,
    engines: list[Process],
    *extra: str,
    port: int | None = None,
    name: str = "router",
    wait: bool = True,
) -> Process:
    """`junction route` over `engines`, waited for until it serves (`wait`); `port` None: a
    free one; its log is `name`.log."""
    port = port or free_port()
    args = ["route", "--port", str(port), "--log-level", "warning", *extra]
    for engine in engines:
        args += ["--engine", engine.url]
    log = log_dir / f"{name}.log"
    router = Process(
        "junction route", junction(*args, log=log, JUNCTION_API_TOKEN=TOKEN), port, log
    )
    if wait:
        router.wait_healthy()
    return router


@contextmanager
def running(*processes: Process) -> Iterator[list[Process]]:
    """Wait until each process answers, hand them over, and stop them all afterwards (after a
    failed start too)."""
    try:
        for process in processes:
            process.wait_healthy()
        yield list(processes)
    finally:
        for process in processes:
            process.stop()


def engine_metric(engine: Process, line_start: str) -> float:
    """One sample of the engine's `/metrics`, by the start of its line (name and labels)."""
    text = httpx.get(f"{engine.url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start} in {engine.url}/metrics")


def fleet(router: Process) -> dict:
    response = httpx.get(f"{router.url}/fleet", headers=AUTH, timeout=5)
    response.raise_for_status()
    return response.json()


def engine_status(router: Process, engine: Process) -> str:
    return next(e["status"] for e in fleet(router)["engines"] if e["url"] == engine.url)
