"""Benchmark runs in the store: submit one (a queued row, then its Celery message), list them,
and a run's life on a worker: start, progress, finish, fail, and the sweep of lost runs
(`api.runs.lifecycle`, shared with the what-if runs). A run goes queued -> running ->
finished | failed, every write a worker makes fenced by its attempt number.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api.runs.broker import BrokerUnavailable as BrokerUnavailable  # what a failed `send` raises
from api.runs.lifecycle import LIVE_HEARTBEAT_S as LIVE_HEARTBEAT_S
from api.runs.lifecycle import MAX_ATTEMPTS as MAX_ATTEMPTS
from api.runs.lifecycle import UNFINISHED as UNFINISHED
from api.runs.lifecycle import Busy, RunLife, Skipped, Started
from api.store.models import BenchmarkRun, utcnow
from api.store.paging import fetch_page

#: Puts a run's message on the broker: `send(run_id, task_id)`.
Send = Callable[[int, str], None]

LIFE = RunLife(
    BenchmarkRun,
    on_start={"progress": 0.0, "progress_message": "starting"},
    on_fail={"progress_message": "failed"},
    spec=lambda run: dict(run.spec),
)


def submit_run(session: Session, spec: dict[str, Any], name: str, send: Send) -> BenchmarkRun:
    """A queued run of `spec`, committed, and its message sent. If sending fails, the row is
    deleted again (a queued run no worker will ever see must not stay) and the error raised."""
    run = BenchmarkRun(name=name, spec=spec, status="queued", task_id=str(uuid.uuid4()))
    session.add(run)
    session.commit()
    try:
        send(run.id, run.task_id)
    except BaseException:
        session.delete(run)
        session.commit()
        raise
    return run


def list_runs(
    session: Session, status: str | None, limit: int, offset: int
) -> tuple[int, Sequence[BenchmarkRun]]:
    """(total, the page): newest first, `status` filters."""
    where = [] if status is None else [BenchmarkRun.status == status]
    order = (BenchmarkRun.created_at.desc(), BenchmarkRun.id.desc())
    return fetch_page(session, BenchmarkRun, where, order, offset, limit)


def start_run(
    session: Session, run_id: int, worker: str | None, now: datetime | None = None
) -> Started | Busy | Skipped:
    """Take run `run_id` for a new attempt (`RunLife.start`)."""
    return LIFE.start(session, run_id, worker, now)


def record_progress(
    session: Session,
    run_id: int,
    attempt: int,
    fraction: float | None = None,
    message: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Write the attempt's progress (clamped to 0..1) and heartbeat; only the heartbeat when
    `fraction` is None. False: the run is no longer this attempt's."""
    values: dict[str, Any] = {"heartbeat_at": now or utcnow()}
    if fraction is not None:
        values["progress"] = min(max(float(fraction), 0.0), 1.0)
        values["progress_message"] = message
    return LIFE.write(session, run_id, attempt, values)


def finish_run(
    session: Session,
    run_id: int,
    attempt: int,
    results: dict[str, Any],
    now: datetime | None = None,
) -> bool:
    """Store the results and mark the run finished. False: the run is no longer the attempt's."""
    now = now or utcnow()
    values = {
        "status": "finished",
        "results": results,
        "progress": 1.0,
        "progress_message": "finished",
        "finished_at": now,
        "heartbeat_at": now,
    }
    return LIFE.write(session, run_id, attempt, values)


def fail_run(
    session: Session,
    run_id: int,
    error: str,
    attempt: int | None = None,
    now: datetime | None = None,
) -> bool:
    """Mark the run failed with `error` (`RunLife.fail`)."""
    return LIFE.fail(session, run_id, error, attempt, now)


def sweep_stale_runs(
    session: Session, stale_after_s: float, now: datetime | None = None
) -> list[int]:
    """Fail the running runs with no heartbeat for `stale_after_s` ("worker lost"); their ids."""
    return LIFE.sweep(session, stale_after_s, now)
