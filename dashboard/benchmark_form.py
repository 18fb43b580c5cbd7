"""What the Benchmarks page's form offers: the modes and runners a spec may name
(`client.schema`), the standard suite's specs as presets (`GET /benchmarks/suite`) beside a
custom spec, and the runs listed as a table."""

from __future__ import annotations

from typing import Any

import pandas as pd

from client.rest import ApiClient
from client.schema import DEFAULT_BLOCK_SIZE, DEFAULT_MAMBA_BLOCK_SIZE, MODES, RUNNER_NAMES

CUSTOM = {
    "name": "shared-prefix",
    "workload": {"kind": "generated_shared_prefix", "seed": 0},
    "runner": "ledger",
    "modes": list(MODES),
    "geometry": {"block_size": DEFAULT_BLOCK_SIZE, "mamba_block_size": DEFAULT_MAMBA_BLOCK_SIZE},
    "concurrency": 8,
}
RUNNERS = list(RUNNER_NAMES)
RUN_COLUMNS = ["id", "name", "status", "progress", "message", "modes", "created", "finished"]


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


def runs_frame(runs: list[dict]) -> pd.DataFrame:
    """One row per run: its state, progress and last message (or why it failed), its modes."""
    rows = [
        {
            "id": run["id"],
            "name": run["name"],
            "status": run["status"],
            "progress": run.get("progress") or 0.0,
            "message": run.get("progress_message") or run.get("error") or "",
            "modes": ", ".join((run.get("spec") or {}).get("modes", [])),
            "created": run["created_at"],
            "finished": run.get("finished_at"),
        }
        for run in runs
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)
