"""Benchmark runs (`GET /benchmarks`, `/benchmarks/{id}`) and what-if runs
(`GET /engines/{id}/whatif`, `/whatif/{id}`), queued or done."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

from client.types.base import Body

RunStatus = Literal["queued", "running", "finished", "failed"]
WhatIfStatus = Literal["queued", "running", "done", "failed"]


class ModeResult(Body):
    """One mode's row of a finished benchmark run's `results` (`bench.run.run_mode`):
    None where the run did not measure it (`bound_hit_rate` before runs measured the bound)."""

    mode: str | None = None
    num_requests: int | None = None
    hit_rate: float | None = None
    oracle_hit_rate: float | None = None
    bound_hit_rate: float | None = None
    computed_tokens: int | None = None
    forward_passes: int | None = None
    cow_copies: int | None = None
    ttft_median_s: float | None = None
    ttft_p99_s: float | None = None
    throughput_tok_s: float | None = None
    wall_s: float | None = None


class BenchmarkResults(Body):
    """The part of a benchmark run's free-form `results` a reader reads: a row per mode."""

    modes: list[ModeResult] = []


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

    @property
    def modes(self) -> list[ModeResult]:
        """`results`' rows by mode (none before the run finished)."""
        return msgspec.convert(self.results or {}, BenchmarkResults).modes

    @property
    def spec_modes(self) -> list[str]:
        """The modes its `spec` names."""
        modes = self.spec.get("modes")
        return [str(mode) for mode in modes] if isinstance(modes, list) else []


class BenchmarkRunPage(Body):
    total: int
    offset: int
    limit: int
    runs: list[BenchmarkRunOut]


class SettingOutcome(Body):
    """One setting's line of a what-if report (`whatif.report.SettingResult`'s JSON):
    the fields it `changes`, the cache `config` it ran with, its hits and its gain over what
    ran."""

    label: str = ""
    changes: dict[str, Any] = {}
    config: dict[str, Any] = {}
    hit_tokens: int = 0
    hit_rate: float = 0.0
    share_of_oracle: float = 0.0
    share_of_bound: float = 0.0
    gain_tokens: int = 0
    pins_not_placed: list[dict[str, Any]] = []  # {"pin": its label, "reason"}: ran without
    # of `hit_tokens`, those past the device pools' own hit that host memory and the disk
    # served (a setting with `host_cache_bytes` / `disk_cache_bytes`; 0 without tiers)
    host_hit_tokens: int = 0
    disk_hit_tokens: int = 0

    def tier_bytes(self, name: str) -> int:
        """The tier's size the setting tried ("host_cache_bytes", "disk_cache_bytes"); 0: none."""
        size = self.changes.get(name)
        return size if isinstance(size, int) and not isinstance(size, bool) else 0

    def pool(self, name: str) -> int | None:
        """A pool's size in its `config` ("num_blocks", "num_mamba_blocks"); None if unset."""
        size = self.config.get(name)
        return size if isinstance(size, int) and not isinstance(size, bool) else None


class WhatIfReport(Body):
    """A done what-if run's `result` (`whatif.report.WhatIfReport`'s JSON): the
    requests replayed, the hits the engine recorded, how many the replay of what ran
    reproduced (`agreement`, `exact` when all), that replay (`as_ran`) and each setting's."""

    num_requests: int = 0
    recorded_tokens: int = 0
    agreement: int = 0
    exact: bool = False
    as_ran: SettingOutcome | None = None
    results: list[SettingOutcome] = []


class WhatIfRunOut(Body):
    """A what-if run: `progress_done` of `progress_total` replays; `result` (once done) the
    report (`whatif.report`'s JSON); `error` why a failed run failed."""

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

    @property
    def report(self) -> WhatIfReport:
        """`result` read as a `WhatIfReport` (an empty one before the run is done)."""
        return msgspec.convert(self.result or {}, WhatIfReport)


class WhatIfRunPage(Body):
    total: int
    offset: int
    limit: int
    runs: list[WhatIfRunOut]
