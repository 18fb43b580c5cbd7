"""What-if runs in the store: submit one (a queued row, then its Celery message), list them,
and a run's life on a worker: start, progress, done, failed, and the sweep of lost runs.

A run goes queued -> running -> done | failed and never leaves done or failed. As a benchmark
run's (`api.runs.benchmarks`), every write a worker makes is fenced by its attempt number, so
no stale worker overwrites what a newer attempt (or the sweep) decided. The table is bounded:
past `JUNCTION_WHATIF_MAX_RUNS` rows a submit deletes the oldest finished runs, and refuses a
new run (`TooManyRuns`) when that many are still queued or running.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from api.runs.benchmarks import LIVE_HEARTBEAT_S, MAX_ATTEMPTS, Busy, Send, Skipped, Started
from api.store.models import WhatIfRun, utcnow
from api.store.paging import fetch_page

UNFINISHED = ("queued", "running")
FINISHED = ("done", "failed")


class TooManyRuns(RuntimeError):
    """`JUNCTION_WHATIF_MAX_RUNS` runs are queued or running: no room for another."""


def submit_run(
    session: Session,
    engine_id: str,
    epoch: int,
    settings: list[dict[str, Any]],
    send: Send,
    max_runs: int,
) -> WhatIfRun:
    """A queued run of `settings` over the engine's `epoch`, committed, and its message sent
    (if sending fails the row goes again and the error is raised). Makes room first: the
    oldest finished runs past `max_runs - 1` go; `TooManyRuns` when the unfinished fill it."""
    prune_finished(session, max_runs - 1)
    unfinished = select(func.count()).where(WhatIfRun.status.in_(UNFINISHED))
    if (session.scalar(unfinished) or 0) >= max_runs:
        session.rollback()
        raise TooManyRuns(
            f"{max_runs} what-if runs are queued or running (JUNCTION_WHATIF_MAX_RUNS): "
            "wait for some to finish"
        )
    run = WhatIfRun(
        engine_id=engine_id,
        epoch=epoch,
        settings=settings,
        status="queued",
        task_id=str(uuid.uuid4()),
    )
    session.add(run)
    session.commit()
    try:
        send(run.id, run.task_id)
    except BaseException:
        session.delete(run)
        session.commit()
        raise
    return run


def prune_finished(session: Session, keep: int) -> int:
    """Delete the oldest done or failed runs until at most `keep` rows are left (as far as
    finished ones allow); returns how many went. Does not commit."""
    total = session.scalar(select(func.count()).select_from(WhatIfRun)) or 0
    excess = total - max(keep, 0)
    if excess <= 0:
        return 0
    oldest = (
        select(WhatIfRun.id)
        .where(WhatIfRun.status.in_(FINISHED))
        .order_by(WhatIfRun.finished_at, WhatIfRun.id)
        .limit(excess)
    )
    query = delete(WhatIfRun).where(WhatIfRun.id.in_(oldest.scalar_subquery()))
    return session.execute(query.execution_options(synchronize_session=False)).rowcount


def list_runs(
    session: Session, engine_id: str, status: str | None, limit: int, offset: int
) -> tuple[int, Sequence[WhatIfRun]]:
    """(total, the page) of the engine's runs: newest first, `status` filters."""
    where = [WhatIfRun.engine_id == engine_id]
    if status is not None:
        where.append(WhatIfRun.status == status)
    order = (WhatIfRun.created_at.desc(), WhatIfRun.id.desc())
    return fetch_page(session, WhatIfRun, where, order, offset, limit)


def start_run(
    session: Session, run_id: int, worker: str | None, now: datetime | None = None
) -> Started | Busy | Skipped:
    """Take run `run_id` for a new attempt and commit (as `api.runs.benchmarks.start_run`:
    a running run is taken over from the same `worker` at once, from another only once its
    heartbeat is older than `LIVE_HEARTBEAT_S`; past `MAX_ATTEMPTS` starts it fails).
    `Started.spec` is `{"engine_id", "epoch", "settings"}`."""
    now = now or utcnow()
    run = session.get(WhatIfRun, run_id, populate_existing=True)
    if run is None or run.status not in UNFINISHED:
        return Skipped(run_id, None if run is None else run.status)
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
        update(WhatIfRun)
        .where(
            WhatIfRun.id == run_id,
            WhatIfRun.status.in_(UNFINISHED),
            WhatIfRun.attempts == run.attempts,
        )
        .values(
            status="running",
            attempts=attempt,
            worker=worker,
            started_at=now,
            heartbeat_at=now,
            finished_at=None,
            error=None,
            progress_done=0,
        )
    ).rowcount
    session.commit()
    if not taken:  # another worker took it between our read and write
        session.expire_all()
        return start_run(session, run_id, worker, now)
    spec = {"engine_id": run.engine_id, "epoch": run.epoch, "settings": list(run.settings)}
    return Started(run_id, attempt, spec)


def _owned(run_id: int, attempt: int) -> tuple:
    return (WhatIfRun.id == run_id, WhatIfRun.status == "running", WhatIfRun.attempts == attempt)


def record_progress(
    session: Session,
    run_id: int,
    attempt: int,
    progress: tuple[int, int] | None = None,
    now: datetime | None = None,
) -> bool:
    """Write the attempt's `progress` (requests replayed, of how many) and heartbeat; only the
    heartbeat when None. False: the run is no longer this attempt's."""
    values: dict[str, Any] = {"heartbeat_at": now or utcnow()}
    if progress is not None:
        values["progress_done"], values["progress_total"] = progress
    owned = session.execute(update(WhatIfRun).where(*_owned(run_id, attempt)).values(values))
    session.commit()
    return bool(owned.rowcount)


def finish_run(
    session: Session, run_id: int, attempt: int, result: dict[str, Any], now: datetime | None = None
) -> bool:
    """Store the report and mark the run done. False: the run is no longer the attempt's."""
    now = now or utcnow()
    owned = session.execute(
        update(WhatIfRun)
        .where(*_owned(run_id, attempt))
        .values(
            status="done",
            result=result,
            progress_done=WhatIfRun.progress_total,
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
    as it is queued or running). False: it was done or failed already, or taken over."""
    where = (
        _owned(run_id, attempt)
        if attempt is not None
        else (WhatIfRun.id == run_id, WhatIfRun.status.in_(UNFINISHED))
    )
    owned = session.execute(
        update(WhatIfRun)
        .where(*where)
        .values(status="failed", error=error, finished_at=now or utcnow())
    )
    session.commit()
    return bool(owned.rowcount)


def sweep_stale_runs(
    session: Session, stale_after_s: float, now: datetime | None = None
) -> list[int]:
    """Fail the running runs with no heartbeat for `stale_after_s` ("worker lost"); their ids."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=stale_after_s)
    last = func.coalesce(WhatIfRun.heartbeat_at, WhatIfRun.started_at, WhatIfRun.created_at)
    stale = session.execute(
        select(WhatIfRun.id, WhatIfRun.attempts).where(WhatIfRun.status == "running", last < cutoff)
    ).all()
    swept = []
    for run_id, attempt in stale:
        reason = f"worker lost: no heartbeat for {stale_after_s:g} s (attempt {attempt})"
        if fail_run(session, run_id, reason, attempt=attempt, now=now):
            swept.append(run_id)
    return swept
