"""The parts `junction up` starts, each a `junction` subcommand in its own process, and where
each answers when it is ready."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Ports:
    api: int = 8080
    engine: int = 8000
    dashboard: int = 8501


@dataclass(frozen=True)
class Part:
    name: str
    argv: list[str]
    port: int | None = None  # the port it listens on (checked free before anything starts)
    url: str | None = None  # what an operator opens
    ready_url: str | None = None  # 200 once it serves


def api_url(host: str, ports: Ports) -> str:
    """The control plane every part talks to (`JUNCTION_CONTROL_PLANE_URL` in their
    environment)."""
    return f"http://{host}:{ports.api}"


def environment(host: str, ports: Ports, api_token: str) -> dict[str, str]:
    """What every part gets in its environment: the one control plane and the one token."""
    return {"JUNCTION_API_TOKEN": api_token, "JUNCTION_CONTROL_PLANE_URL": api_url(host, ports)}


def junction(*args: str) -> list[str]:
    """`junction ARGS` with this interpreter (the venv `make run` made)."""
    return [sys.executable, "-m", "cli.main", *args]


def plan(
    host: str,
    ports: Ports,
    runner: str = "torch",
    engine_id: str = "engine-0",
    device: str | None = None,
    with_jobs: bool = True,
    serve_args: tuple[str, ...] = (),
) -> list[Part]:
    """The parts in start order: the API first (the engine streams to it, the dashboard reads
    it), the engine, the dashboard, then the worker and beat."""
    control_plane = api_url(host, ports)
    engine_url = f"http://{host}:{ports.engine}"
    dashboard_url = f"http://{host}:{ports.dashboard}"
    serve = ["serve", "--host", host, "--port", str(ports.engine), "--runner", runner]
    serve += ["--engine-id", engine_id, "--control-plane", control_plane]
    if device:
        serve += ["--device", device]
    serve += serve_args  # last: what the operator passed through wins
    parts = [
        Part(
            "api",
            junction("api", "--host", host, "--port", str(ports.api)),
            ports.api,
            f"{control_plane}/docs",
            f"{control_plane}/healthz",
        ),
        Part("engine", junction(*serve), ports.engine, f"{engine_url}/v1", f"{engine_url}/health"),
        Part(
            "dashboard",
            junction("dashboard", "--host", host, "--port", str(ports.dashboard)),
            ports.dashboard,
            dashboard_url,
            f"{dashboard_url}/_stcore/health",
        ),
    ]
    if with_jobs:
        parts += [
            Part("worker", junction("worker", "--concurrency", "1", "--loglevel", "info")),
            Part("beat", junction("beat")),  # its schedule file in the working directory
        ]
    return parts
