"""What a what-if task does, as plain functions that run without a worker: run one what-if
run (the engine's recording read from the store, replayed under each setting by
`whatif.run.run_whatif`, its progress written at most once a second). A task that gave
up and the sweep of the runs whose worker was lost are every kind's (`jobs.runs`,
`record_failure` and `sweep_stale_runs` with `api.whatif.runs.LIFE`). The store is
`api.whatif.runs` over `JUNCTION_DATABASE_URL` (or the `sessions` given)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from api.runs.lifecycle import Busy, Skipped, Started
from api.settings import get_settings
from api.whatif import runs as store
from api.whatif.recording import load_recording
from jobs.runs import (
    HEARTBEAT_S,
    Done,
    Reporter,
    Sessions,
    run_attempt,
    store_sessions,
)
from whatif.recording import Recording

#: Progress reaches the store at most this often; the last word always does.
PROGRESS_EVERY_S = 1.0
#: `run_whatif(recording, settings, progress)`, as `whatif.run` has it.
Runner = Callable[..., Any]


class WhatIfReporter(Reporter):
    """A `jobs.runs.Reporter` whose progress is (requests replayed, of how many)."""

    what = "what-if run"

    def write(self, session: Session, fraction: Any, message: str | None) -> bool:
        return store.record_progress(session, self.run_id, self.attempt, fraction)

    def progress(self, done: int, total: int) -> None:
        """`run_whatif`'s progress callback."""
        self((int(done), int(total)))


def run_whatif_run(
    run_id: int,
    *,
    sessions: Sessions | None = None,
    worker: str | None = None,
    runner: Runner | None = None,
    progress_every_s: float = PROGRESS_EVERY_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> Done | Busy | Skipped:
    """Run what-if run `run_id`: take it (`RunLife.start`), load the engine's recording of
    its epoch, replay it with `runner` (default `whatif.run.run_whatif`) writing
    progress, then store the report (`WhatIfReport.as_dict()`) and mark it done.

    A recording, setting or replay that raises marks the run failed with `describe(exc)` and
    re-raises; store errors (`TRANSIENT_ERRORS`) propagate for the task to retry. `Busy`:
    another worker's attempt is alive; `Skipped`: nothing to do (gone, done or failed)."""
    sessions = sessions or store_sessions()

    def work(taken: Started, reporter: WhatIfReporter) -> dict:
        return replay(sessions, taken.spec, reporter.progress, runner)

    reporter = partial(WhatIfReporter, every_s=progress_every_s, heartbeat_s=heartbeat_s)
    return run_attempt(store.LIFE, run_id, worker, sessions, reporter, work)


def replay(
    sessions: Sessions,
    spec: dict[str, Any],
    progress: Callable[[int, int], None],
    runner: Runner | None = None,
) -> dict[str, Any]:
    """The report (as JSON) of `spec`'s settings replayed over its engine's recording."""
    from whatif.settings import parse_settings

    settings = parse_settings(spec["settings"])
    with sessions() as session:
        recording = load_recording(
            session, spec["engine_id"], spec["epoch"], get_settings().whatif_max_requests
        )
    return _run(runner, recording, settings, progress).as_dict()


def _run(runner: Runner | None, recording: Recording, settings: Sequence, progress) -> Any:
    """`runner`, or `whatif.run.run_whatif` within `JUNCTION_WHATIF_MAX_BYTES` and
    `JUNCTION_WHATIF_MAX_SECONDS` (a run over them, estimated or as it goes, fails saying so)."""
    if runner is None:
        from whatif.budget import Limits
        from whatif.run import run_whatif  # the engine loads when a run starts

        config = get_settings()
        limits = Limits(config.whatif_max_bytes, config.whatif_max_seconds)
        runner = partial(run_whatif, limits=limits)
    return runner(recording, settings, progress)
