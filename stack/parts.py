"""The parts `junction up` starts, each a `junction` subcommand in its own process, and where
each answers when it is ready."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

#: Benchmark runs the worker runs at once: two, so a short run queued behind a long one (the
#: suite's presets run for minutes) starts at once instead of waiting for it. Each is one
#: replay process; more would only share the same cores.
WORKER_CONCURRENCY = 2
#: Celery's worker and beat under `junction up`: their banners (50 lines after the URLs) left
#: out, their log at warnings and errors (`junction worker`/`beat` alone keep Celery's).
QUIET = ("--loglevel", "warning", "--quiet")


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
    # an engine's id: ready only once the control plane accepted its feed under it (its own
    # `/health` answers before its hello is welcomed, or refused)
    engine_id: str | None = None


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
    engine_id: str | None = None,
    device: str | None = None,
    with_jobs: bool = True,
    serve_args: tuple[str, ...] = (),
    num_engines: int = 1,
    model: str | None = None,
    shared_cache: str | None = None,
) -> list[Part]:
    """The parts in start order: the API first (the engines stream to it, the dashboard reads
    it), the engines, the router in front of them when there are several, the dashboard, then
    the worker and beat.

    One engine listens on `ports.engine` itself; N >= 2 listen on the N ports after it (the
    parts `engine-0` ... `engine-<N-1>`), and `junction route` takes `ports.engine`: the
    OpenAI URL is the same either way. The engines' ids are `stack.engine_ids`' (named from
    `model` when given; `engine_id` the one engine's own). `shared_cache`: the
    `--shared-cache-url` every engine is given (`shared_cache_url`), before the operator's
    own options."""
    from stack.engine_ids import engine_ids

    ids = engine_ids(num_engines, model, engine_id)
    control_plane = api_url(host, ports)
    dashboard_url = f"http://{host}:{ports.dashboard}"

    def engine(name: str, port: int, engine_id: str) -> Part:
        serve = ["serve", "--host", host, "--port", str(port), "--runner", runner]
        serve += ["--engine-id", engine_id, "--control-plane", control_plane]
        if device:
            serve += ["--device", device]
        if shared_cache is not None:
            serve += ["--shared-cache-url", shared_cache]
        serve += serve_args  # last: what the operator passed through wins
        url = f"http://{host}:{port}"
        return Part(name, junction(*serve), port, f"{url}/v1", f"{url}/health", engine_id)

    parts = [
        Part(
            "api",
            junction("api", "--host", host, "--port", str(ports.api)),
            ports.api,
            f"{control_plane}/docs",
            f"{control_plane}/healthz",
        )
    ]
    if num_engines == 1:
        parts.append(engine("engine", ports.engine, ids[0]))
    else:
        engine_ports = [ports.engine + 1 + i for i in range(num_engines)]
        parts += [engine(f"engine-{i}", port, ids[i]) for i, port in enumerate(engine_ports)]
        parts.append(router(host, ports.engine, engine_ports, model))
    dashboard = ["dashboard", "--host", host, "--port", str(ports.dashboard)]
    if num_engines > 1:  # the Fleet page reads the router
        dashboard += ["--router-url", f"http://{host}:{ports.engine}"]
    parts.append(
        Part(
            "dashboard",
            junction(*dashboard),
            ports.dashboard,
            dashboard_url,
            f"{dashboard_url}/_stcore/health",
        )
    )
    if with_jobs:
        parts += [
            # no banners, warnings and errors only: the URLs stay the last thing printed
            Part("worker", junction("worker", "--concurrency", str(WORKER_CONCURRENCY), *QUIET)),
            Part("beat", junction("beat", *QUIET)),  # its schedule file in the working directory
        ]
    return parts


SHARED_DIR = "junction-shared-cache"


def shared_cache_url(
    num_engines: int, serve_args: tuple[str, ...], database_url: str, environ: dict[str, str]
) -> str | None:
    """What `--shared-cache-url` `junction up` gives its engines: with several, a directory
    beside the SQLite store (or in the working directory) they share units through, unless
    the operator names a store (`-- --shared-cache-url`, `JUNCTION_SHARED_CACHE_URL`: Redis, or
    a directory of their own); None with one engine, or when the operator named one."""
    named = any(arg.split("=", 1)[0] == "--shared-cache-url" for arg in serve_args)
    if num_engines < 2 or named or environ.get("JUNCTION_SHARED_CACHE_URL"):
        return None
    if database_url.startswith("sqlite:///"):
        base = Path(database_url.removeprefix("sqlite:///")).resolve().parent
    else:
        base = Path.cwd()
    return str(base / SHARED_DIR)


def router(host: str, port: int, engine_ports: list[int], model: str | None) -> Part:
    """`junction route` on `port` over the engines on `engine_ports` (their cache feeds read
    with the token in its environment), ready once one of them is up; `model`, the engines'
    checkpoint, gives it their tokenizer and chat template."""
    route = ["route", "--host", host, "--port", str(port)]
    for engine_port in engine_ports:
        route += ["--engine", f"http://{host}:{engine_port}"]
    if model is not None:
        route += ["--model", model]
    url = f"http://{host}:{port}"
    return Part("router", junction(*route), port, f"{url}/v1", f"{url}/health")
