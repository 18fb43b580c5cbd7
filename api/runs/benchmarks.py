"""Benchmark runs in the store: submit one (a queued row, then its Celery message), list them,
and a run's life on a worker: start, progress, finish, fail, and the sweep of lost runs.

A run goes queued -> running -> finished | failed and never leaves finished or failed. Every
write a worker makes is fenced by its attempt number (`attempts` after its start): a run that
was swept, or started again by a later delivery of its message, ignores the writes of the
attempt it took over from, so no stale worker can overwrite what a newer one (or the sweep)
decided.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from api.runs.broker import BrokerUnavailable as BrokerUnavailable  # what a failed `send` raises
from api.store.models import BenchmarkRun, utcnow
from api.store.paging import fetch_page

UNFINISHED = ("queued", "running")
#: Starts of one run (first delivery, retries, redeliveries after a lost worker) before it fails.
MAX_ATTEMPTS = 3
#: A running run whose heartbeat is younger than this is being run by a live worker.
LIVE_HEARTBEAT_S = 90.0

#: Puts a run's message on the broker: `send(run_id, task_id)`.
Send = Callable[[int, str], None]


class Started(NamedTuple):
    """A run a worker now owns: its spec, and the attempt that fences its writes."""

    run_id: int
    attempt: int
    spec: dict[str, Any]


class Busy(NamedTuple):
    """Another worker's attempt is alive (fresh heartbeat): look again in `retry_in_s`."""

    run_id: int
    retry_in_s: float


class Skipped(NamedTuple):
    """Nothing to run: the run is gone, or already finished or failed (`status`)."""

    run_id: int
    status: str | None


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
    """Take run `run_id` for a new attempt and commit. A running run is taken over from the
    same `worker` at once, from another only once its heartbeat is older than
    `LIVE_HEARTBEAT_S` (that worker is gone); one that has had `MAX_ATTEMPTS` starts fails
    instead."""
    now = now or utcnow()
    run = session.get(BenchmarkRun, run_id, populate_existing=True)
    if run is None or run.status not in UNFINISHED:
        return Skipped(run_id, None if run is None else run.status)
    # the same worker's earlier attempt is over (its process died, or the task is retrying)
    if run.status == "running" and (worker is None or run.worker != worker):
        last = run.heartbeat_at or run.started_at
        if last is not None and now - last < timedelta(seconds=LIVE_HEARTBEAT_S):
            return Busy(run_id, LIVE_HEARTBEAT_S - (now - last).total_seconds() + 1.0)
    if run.attempts >= MAX_ATTEMPTS:
        reason = f"gave up after {run.attempts} attempts (the last one's worker was lost)"
        fail_run(session, run_id, reason, now=now)
        return Skipped(run_id, "failed")
    attempt = run.attempts + 1
    taken = session.execute(
        update(BenchmarkRun)
        .where(
            BenchmarkRun.id == run_id,
            BenchmarkRun.status.in_(UNFINISHED),
            BenchmarkRun.attempts == run.attempts,
        )
        .values(
            status="running",
            attempts=attempt,
            worker=worker,
            started_at=now,
            heartbeat_at=now,
            finished_at=None,
            error=None,
            progress=0.0,
            progress_message="starting",
        )
    ).rowcount
    session.commit()
    if not taken:  # another worker took it between our read and write
        session.expire_all()
        return start_run(session, run_id, worker, now)
    return Started(run_id, attempt, dict(run.spec))


def _owned(run_id: int, attempt: int) -> tuple:
    return (
        BenchmarkRun.id == run_id,
        BenchmarkRun.status == "running",
        BenchmarkRun.attempts == attempt,
    )


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
    owned = session.execute(update(BenchmarkRun).where(*_owned(run_id, attempt)).values(values))
    session.commit()
    return bool(owned.rowcount)


def finish_run(
    session: Session,
    run_id: int,
    attempt: int,
    results: dict[str, Any],
    now: datetime | None = None,
) -> bool:
    """Store the results and mark the run finished. False: the run is no longer the attempt's."""
    now = now or utcnow()
    owned = session.execute(
        update(BenchmarkRun)
        .where(*_owned(run_id, attempt))
        .values(
            status="finished",
            results=results,
            progress=1.0,
            progress_message="finished",
            finished_at=now,
            heartbeat_at=now,
        )
    )
    session.commit()
    return bool(owned.rowcount)


def fail_run(
    session: Session,
    run_id: int,
    error: str,
    attempt: int | None = None,
    now: datetime | None = None,
) -> bool:
    """Mark the run failed with `error`: if it is `attempt`'s (None: whatever attempt, as long
    as it is queued or running). False: it was finished or failed already, or taken over."""
    now = now or utcnow()
    where = (
        _owned(run_id, attempt)
        if attempt is not None
        else (BenchmarkRun.id == run_id, BenchmarkRun.status.in_(UNFINISHED))
    )
    owned = session.execute(
        update(BenchmarkRun)
        .where(*where)
        .values(status="failed", error=error, finished_at=now, progress_message="failed")
    )
    session.commit()
    return bool(owned.rowcount)


def sweep_stale_runs(
    session: Session, stale_after_s: float, now: datetime | None = None
) -> list[int]:
    """Fail the running runs with no heartbeat for `stale_after_s` ("worker lost"); their ids."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=stale_after_s)
    last = func.coalesce(
        BenchmarkRun.heartbeat_at, BenchmarkRun.started_at, BenchmarkRun.created_at
    )
    stale = session.execute(
        select(BenchmarkRun.id, BenchmarkRun.attempts).where(
            BenchmarkRun.status == "running", last < cutoff
        )
    ).all()
    swept = []
    for run_id, attempt in stale:
        reason = f"worker lost: no heartbeat for {stale_after_s:g} s (attempt {attempt})"
        if fail_run(session, run_id, reason, attempt=attempt, now=now):
            swept.append(run_id)
    return swept
