"""A live control plane for the dashboard's tests, seeded by a real replay.

One `junction api` per session on a SQLite file, and `junction replay --runner ledger` of
`seed_trace()` streaming to it (a pin line, shared prefixes with copies on write, a junction
the replay leaves without a checkpoint, a multi-turn extension). The pages read it through
REST exactly as they would in production; tests compare what they show with what REST says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.processes import AUTH, TOKEN, ApiProcess, free_port

REPLAY_ENGINE = "replay-0"
GEOMETRY = [
    "--block-size",
    "16",
    "--mamba-block-size",
    "64",
    "--prefix-match-unit",
    "16",
    "--num-blocks",
    "320",
    "--num-mamba-blocks",
    "160",
]


def segments(*parts: tuple[int, int]) -> dict:
    return {"segments": [{"seed": seed, "len": length} for seed, length in parts]}


def seed_trace() -> list[dict]:
    """A pinned 560-token system prompt and its questions; a 300-token prefix shared by four
    requests (a junction: no checkpoint there without junction checkpoints); a two-turn chat."""
    lines: list[dict] = [{"pin": segments((1, 560)), "id": "system"}]
    lines.append({"id": "t1", "prompt": segments((3, 400))})
    for i in range(6):
        lines.append({"id": f"q{i + 1}", "prompt": segments((1, 560), (20 + i, 100 + 40 * i))})
    for i in range(4):
        lines.append({"id": f"f{i + 1}", "prompt": segments((2, 300), (40 + i, 90))})
    lines.append({"id": "t2", "prompt": segments((3, 400), (4, 120))})
    for line in lines:
        if "prompt" in line:
            line["max_tokens"] = 4
    return lines


def replay(
    api_url: str,
    trace: Path,
    out: Path,
    engine_id: str = REPLAY_ENGINE,
    options: tuple[str, ...] = (),
) -> list[dict]:
    """`junction replay` of `trace` streaming to `api_url`, with `GEOMETRY` then `options`
    (a later option wins); returns its output lines."""
    command = [
        sys.executable,
        "-m",
        "cli.main",
        "replay",
        str(trace),
        "--runner",
        "ledger",
        *GEOMETRY,
        "--concurrency",
        "2",
        *options,
        "--engine-id",
        engine_id,
        "--control-plane",
        api_url,
        "--token",
        TOKEN,
        "--out",
        str(out),
        "--quiet",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


BENCHMARK = {
    "name": "dashboard-gsp",
    "workload": {
        "kind": "generated_shared_prefix",
        "seed": 0,
        "num_groups": 2,
        "prompts_per_group": 4,
        "system_prompt_len": 300,
        "question_len": 50,
        "output_len": 4,
    },
    "runner": "ledger",
    "geometry": {"block_size": 16, "mamba_block_size": 64, "num_blocks": 512},
    "concurrency": 2,
}


class Stack:
    """The API process, what the replay wrote, and the benchmark run it holds."""

    def __init__(self, api: ApiProcess, outputs: list[dict]) -> None:
        self.api = api
        self.url = api.url
        self.database_url = api.database_url
        self.outputs = {line["id"]: line for line in outputs}
        self.benchmark_id: int | None = None

    def get(self, path: str, **params) -> dict | list:
        response = httpx.get(f"{self.url}/api/v1{path}", params=params, headers=AUTH, timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict) -> dict:
        response = httpx.post(f"{self.url}/api/v1{path}", json=body, headers=AUTH, timeout=30)
        assert response.status_code < 300, response.text
        return response.json()


def run_benchmark(stack: Stack) -> int:
    """Queue `BENCHMARK` through REST and run it as a worker would (`jobs.runs`)."""
    from jobs.runs import run_benchmark_run, store_sessions

    run = stack.post("/benchmarks", BENCHMARK)
    done = run_benchmark_run(run["id"], sessions=store_sessions(stack.database_url))
    assert done.status == "finished", done
    return run["id"]


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("dashboard")
    api = ApiProcess(f"sqlite:///{root / 'junction.db'}", free_port())
    with pytest.MonkeyPatch.context() as patch:  # queued runs go to a scratch broker
        patch.setenv("JUNCTION_BROKER_URL", f"sqla+sqlite:///{root / 'broker.db'}")
        api.start()
    try:
        trace = root / "trace.jsonl"
        trace.write_text("".join(json.dumps(line) + "\n" for line in seed_trace()))
        stack = Stack(api, replay(api.url, trace, root / "out.jsonl"))
        stack.benchmark_id = run_benchmark(stack)
        yield stack
    finally:
        api.kill()


@pytest.fixture
def dashboard_env(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """The dashboard's settings pointed at the stack (read by every script run): it reads with
    the API's token; writes need the one a visitor enters (`open_page(write_token=...)`)."""
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", stack.url)
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    monkeypatch.delenv("JUNCTION_READ_TOKEN", raising=False)
    monkeypatch.setenv("JUNCTION_DASHBOARD_REFRESH_S", "3600")
    return stack


def chromium_or_skip() -> str:
    """Debian's chromium; under CI a missing one fails the run (`.ci/run` installs it)."""
    path = "/usr/bin/chromium"
    if not os.path.exists(path):
        message = f"{path} is missing (apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
