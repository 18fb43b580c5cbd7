"""What the Benchmarks page's form offers: the modes and runners a spec may name
(`client.schema`), a quick spec as the default preset beside the standard suite's specs
(`GET /benchmarks/suite`), the size of a spec before it is queued, and the runs as a table."""

from __future__ import annotations

from typing import Any, NamedTuple

import pandas as pd

from client.rest import ApiClient
from client.schema import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAMBA_BLOCK_SIZE,
    MODES,
    RUNNER_NAMES,
    build_workload,
)
from client.types import BenchmarkRunOut

QUICK_NAME = "quick"
#: The default preset: 64 requests x 6 modes. `junction bench` of it took 2.4 s on the ledger
#: runner, process start included (2026-12-03), where the suite's specs take minutes.
QUICK = {
    "name": "quick-shared-prefix",
    "workload": {
        "kind": "generated_shared_prefix",
        "seed": 0,
        "num_groups": 8,
        "prompts_per_group": 8,
        "system_prompt_len": 1024,
        "question_len": 64,
        "output_len": 32,
    },
    "runner": "ledger",
    "modes": list(MODES),
    "geometry": {"block_size": DEFAULT_BLOCK_SIZE, "mamba_block_size": DEFAULT_MAMBA_BLOCK_SIZE},
    "concurrency": 8,
}
#: Replays (requests x modes) past which the form warns that the run holds the worker long.
LONG_RUN_REPLAYS = 2_000
RUNNERS = list(RUNNER_NAMES)
RUN_COLUMNS = ["id", "name", "status", "progress", "message", "modes", "created", "finished"]


class Estimate(NamedTuple):
    """What a run will replay, counted from its spec before it is queued."""

    num_requests: int  # requests of the workload, replayed once per mode
    num_prompt_tokens: int  # their prompt tokens, in each mode
    num_modes: int

    @property
    def num_replays(self) -> int:
        return self.num_requests * self.num_modes

    def text(self, runner: str) -> str:
        return (
            f"This run replays {self.num_requests:,} requests ({self.num_prompt_tokens:,} "
            f"prompt tokens) × {self.num_modes} modes = **{self.num_replays:,} requests** on "
            f"the {runner} runner."
        )


def estimate(workload: dict, modes: list[str]) -> Estimate:
    """The run's size: its workload built as the worker will build it. Raises `ValueError`
    (pydantic's `ValidationError` is one) for a workload the API would refuse."""
    built = build_workload(workload)
    return Estimate(built.num_requests, built.num_prompt_tokens, len(modes))


QUICK_SIZE = estimate(QUICK["workload"], QUICK["modes"])
QUICK_NOTE = (
    f"**{QUICK_NAME}** (the default preset): 8 shared 1,024-token system prompts with 8 "
    f"questions each, {QUICK_SIZE.num_requests} requests × {QUICK_SIZE.num_modes} modes, a few "
    "seconds on the ledger runner (2.4 s with `junction bench`). The suite's presets run for "
    "minutes; the worker of `junction up` runs two runs at once, so a third waits for one."
)


def presets(api: ApiClient) -> dict[str, dict]:
    """The standard suite's specs by name, as the form shows them: the fields left unset (None)
    left out. Raises `ApiError` when the control plane does not give them."""
    return {spec["name"]: without_none(spec) for spec in api.benchmark_suite()}


def without_none(value: Any) -> Any:
    """`value` with every None of its dicts left out, at any depth."""
    if isinstance(value, dict):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value


def runs_frame(runs: list[BenchmarkRunOut]) -> pd.DataFrame:
    """One row per run: its state, progress and last message (or why it failed), its modes."""
    rows = [
        {
            "id": run.id,
            "name": run.name,
            "status": run.status,
            "progress": run.progress or 0.0,
            "message": run.progress_message or run.error or "",
            "modes": ", ".join(run.spec_modes),
            "created": run.created_at,
            "finished": run.finished_at,
        }
        for run in runs
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)
