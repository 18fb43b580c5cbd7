"""A router restart, timed from the process's start (issue 50: back within 2 s).

Three `junction serve --runner null` engines are filled with distinct long prompts, so each
one's cache feed opens with a snapshot of thousands of blocks. Then, `--runs` times, a fresh
`junction route --engine ...` over them is started as a subprocess and timed from `Popen` to
its first 200 on `/health` (it serves: one engine's snapshot is in) and to `/fleet` saying
`ready` (every engine's snapshot is in: `router.readiness`), then killed with SIGKILL, as a
crashed router is. Each run also starts the same router with torch imported first (`python -c
"import torch, runpy; ..."`): the start it had while `junction`'s imports loaded torch. The two
alternate, so load on the machine falls on both alike.

Printed: per run and the median of each, with the router's own `ready_after_s` (its start to
every engine in: the index rebuild) and the keys it indexed; beside them, in fresh
interpreters, the import of `cli.main`, of torch alone, and `junction --help` end to end.

    .venv/bin/python benchmarks/router_restart.py [--runs 5] [--engines 3]
        [--prompts 48] [--prompt-tokens 2400] [--num-blocks 8192]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `benchmarks.ports` is beside it
    sys.path.insert(0, str(ROOT))

from benchmarks.ports import free_port  # noqa: E402
from engine.traces.trace import segment_tokens  # noqa: E402

TOKEN = "router-restart-benchmark-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "junction-hybrid-tiny"
JUNCTION = [sys.executable, "-m", "cli.main"]
#: `junction` with torch loaded before anything of the project's (argv[0] is "-c")
TORCH_FIRST = [
    sys.executable,
    "-c",
    "import torch, runpy, sys; sys.argv[0] = 'junction'; "
    "runpy.run_module('cli.main', run_name='__main__')",
]
POLL_S = 0.005


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    return {**env, "JUNCTION_API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}


def wait_status(url: str, timeout_s: float = 300.0) -> None:
    """Until `url` answers 200 (an engine starting: torch and all)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 in {timeout_s:g} s")


def start_engines(count: int, num_blocks: int, logs: Path) -> tuple[list[str], list]:
    """`count` null-runner engines, answering; their URLs and processes."""
    urls, children = [], []
    for i in range(count):
        port = free_port()
        args = ["serve", "--runner", "null", "--port", str(port), "--engine-id", f"e{i}"]
        args += ["--num-blocks", str(num_blocks), "--log-level", "warning"]
        with (logs / f"engine-{i}.log").open("wb") as log:
            children.append(
                subprocess.Popen(
                    [*JUNCTION, *args], cwd=ROOT, env=child_env(), stdout=log, stderr=log
                )
            )
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_status(url + "/health")
    return urls, children


async def fill(urls: list[str], num_prompts: int, prompt_tokens: int) -> None:
    """`num_prompts` distinct prompts to each engine, 4 at a time per engine, so its cache
    (and the snapshot a router reads) holds their blocks."""

    async def one(client: httpx.AsyncClient, gate: asyncio.Semaphore, url: str, seed: int):
        body = {"model": MODEL, "prompt": segment_tokens(seed, prompt_tokens), "max_tokens": 1}
        async with gate:
            response = await client.post(url + "/v1/completions", json=body)
            response.raise_for_status()

    async with httpx.AsyncClient(timeout=300) as client:
        jobs = []
        for e, url in enumerate(urls):
            gate = asyncio.Semaphore(4)
            jobs += [one(client, gate, url, 10_000 * e + p) for p in range(num_prompts)]
        await asyncio.gather(*jobs)


@dataclass(frozen=True)
class Start:
    health_s: float  # Popen to the first 200 on /health
    ready_s: float  # Popen to /fleet saying "ready"
    ready_after_s: float | None  # the router's own: its start to every engine in
    num_keys: int  # attention keys indexed, over the engines


def time_router(command: list[str], urls: list[str], log: Path) -> Start:
    """One router started with `command`, timed, then killed with SIGKILL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["route", "--port", str(port), "--log-level", "warning"]
    for url in urls:
        args += ["--engine", url]
    with log.open("wb") as out:
        started = time.perf_counter()
        child = subprocess.Popen(
            [*command, *args], cwd=ROOT, env=child_env(), stdout=out, stderr=out
        )
    try:
        with httpx.Client(timeout=2) as client:
            health_s = poll(client, started, child, lambda: client.get(base + "/health"))
            view: dict = {}

            def fleet() -> httpx.Response:
                nonlocal view
                response = client.get(base + "/fleet", headers=AUTH)
                view = response.json() if response.status_code == 200 else {}
                return response if view.get("status") == "ready" else httpx.Response(503)

            ready_s = poll(client, started, child, fleet)
    finally:
        child.kill()
        child.wait()
    keys = sum(e["num_keys"].get("attention", 0) for e in view["engines"])
    return Start(health_s, ready_s, view.get("ready_after_s"), keys)


def poll(client: httpx.Client, started: float, child, ask, timeout_s: float = 120.0) -> float:
    """Seconds from `started` to `ask()` answering 200, asked every `POLL_S`."""
    while time.perf_counter() - started < timeout_s:
        if child.poll() is not None:
            raise RuntimeError(f"the router exited with {child.returncode}: see its log")
        try:
            if ask().status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"no answer in {timeout_s:g} s")


def fresh_seconds(code: str) -> float:
    """What `code` prints (a duration), run in a fresh interpreter in the repository."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(done.stderr)
    return float(done.stdout.split()[-1])


def import_figures(runs: int) -> dict[str, float]:
    """Medians over `runs` fresh interpreters: `import cli.main`, `import torch`, and
    `junction --help` from `Popen` to its exit."""
    timed = "import time; t = time.perf_counter(); import {}; print(time.perf_counter() - t)"
    figures: dict[str, list[float]] = {"import cli.main": [], "import torch": [], "help": []}
    for _ in range(runs):
        figures["import cli.main"].append(fresh_seconds(timed.format("cli.main")))
        figures["import torch"].append(fresh_seconds(timed.format("torch")))
        started = time.perf_counter()
        subprocess.run([*JUNCTION, "--help"], cwd=ROOT, env=child_env(), capture_output=True)
        figures["help"].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in figures.items()}


def show(name: str, starts: list[Start]) -> None:
    for i, s in enumerate(starts):
        after = "-" if s.ready_after_s is None else f"{s.ready_after_s:.2f}"
        print(
            f"  {name:<13} run {i + 1}: /health {s.health_s:5.2f} s   ready {s.ready_s:5.2f} s"
            f"   (router's ready_after_s {after} s, {s.num_keys:,} attention keys)"
        )


def median_line(name: str, starts: list[Start]) -> str:
    health = statistics.median(s.health_s for s in starts)
    ready = statistics.median(s.ready_s for s in starts)
    return f"  {name:<13} median: /health {health:5.2f} s   ready {ready:5.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=48, help="distinct prompts per engine")
    parser.add_argument("--prompt-tokens", type=int, default=2400)
    parser.add_argument("--num-blocks", type=int, default=8192, help="each engine's blocks")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="junction-router-restart-") as logs:
        urls, engines = start_engines(args.engines, args.num_blocks, Path(logs))
        try:
            asyncio.run(fill(urls, args.prompts, args.prompt_tokens))
            light, heavy = [], []
            for i in range(args.runs):
                light.append(time_router(JUNCTION, urls, Path(logs) / f"router-{i}.log"))
                heavy.append(time_router(TORCH_FIRST, urls, Path(logs) / f"torch-{i}.log"))
        finally:
            for engine in engines:
                engine.terminate()
            for engine in engines:
                engine.wait(15)
    print(f"{args.engines} engines, {args.prompts} prompts of {args.prompt_tokens} tokens each")
    show("junction", light)
    show("torch first", heavy)
    print(median_line("junction", light))
    print(median_line("torch first", heavy))
    figures = import_figures(args.runs)
    print(
        f"fresh interpreter, median of {args.runs}: import cli.main "
        f"{figures['import cli.main']:.2f} s, import torch {figures['import torch']:.2f} s, "
        f"`junction --help` {figures['help']:.2f} s end to end"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
