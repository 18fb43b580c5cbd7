"""Benchmark runs (`GET /benchmarks`, `/benchmarks/{id}`) and what-if runs
(`GET /engines/{id}/whatif`, `/whatif/{id}`), queued or done."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from client.types.base import Body

RunStatus = Literal["queued", "running", "finished", "failed"]
WhatIfStatus = Literal["queued", "running", "done", "failed"]


class BenchmarkRunOut(Body):
    """A benchmark run: `spec` the `BenchmarkSpec` it replays, `progress` 0..1, `results` (once
    finished) `run_benchmark`'s `{"modes", "oracle", "workload"}`."""

    id: int
    name: str
    status: RunStatus
    spec: dict[str, Any]
    progress: float
    progress_message: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    attempts: int
    task_id: str | None
    worker: str | None
    results: dict[str, Any] | None


class BenchmarkRunPage(Body):
    total: int
    offset: int
    limit: int
    runs: list[BenchmarkRunOut]


class WhatIfRunOut(Body):
    """A what-if run: `progress_done` of `progress_total` replays; `result` (once done) the
    report (`engine.whatif.report`'s JSON); `error` why a failed run failed."""

    id: int
    engine_id: str
    epoch: int
    status: WhatIfStatus
    settings: list[dict[str, Any]]
    progress_done: int
    progress_total: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    attempts: int
    worker: str | None
    result: dict[str, Any] | None


class WhatIfRunPage(Body):
    total: int
    offset: int
    limit: int
    runs: list[WhatIfRunOut]
