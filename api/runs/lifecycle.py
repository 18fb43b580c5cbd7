"""A job run's life on a worker, one piece for every kind of run (benchmark runs, what-if
runs): queue a run, start an attempt, write its progress and what it returns, fail, and
sweep the lost.

A run goes queued -> running -> done or failed (the names of its table) and never leaves the
last two. Every write a worker makes is fenced by its attempt number (`attempts` after its
start): a run that was swept, or started again by a later delivery of its message, ignores the
writes of the attempt it took over from, so no stale worker can overwrite what a newer one (or
the sweep) decided.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from api.store.models import utcnow

UNFINISHED = ("queued", "running")
#: Puts a run's message on the broker: `send(run_id, task_id)`.
Send = Callable[[int, str], None]
#: Starts of one run (first delivery, retries, redeliveries after a lost worker) before it fails.
MAX_ATTEMPTS = 3
#: A running run whose heartbeat is younger than this is being run by a live worker.
LIVE_HEARTBEAT_S = 90.0


def queue(session: Session, run: Any, send: Send) -> Any:
    """`run`, a new queued row, committed, and its message sent. If sending fails, the row is
    deleted again (a queued run no worker will ever see must not stay) and the error raised."""
    session.add(run)
    session.commit()
    try:
        send(run.id, run.task_id)
    except BaseException:
        session.delete(run)
        session.commit()
        raise
    return run


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


class RunLife:
    """The life of the runs of `model` (a table with `id`, `status`, `attempts`, `worker`,
    `started_at`, `heartbeat_at`, `finished_at`, `error`, `created_at`), one per kind of run:
    `what` names a run of it in messages, `done` is the status its finished runs take;
    `on_start` and `on_fail` are the table's own columns a start resets and a failure sets,
    `on_finish(result)` those a finish sets, and `spec` what a started attempt runs."""

    def __init__(
        self,
        model: Any,
        what: str,
        done: str,
        on_start: dict[str, Any],
        on_finish: Callable[[dict[str, Any]], dict[str, Any]],
        on_fail: dict[str, Any],
        spec: Callable[[Any], dict[str, Any]],
    ) -> None:
        self.model, self.what, self.done = model, what, done
        self.on_start, self.on_finish, self.on_fail = on_start, on_finish, on_fail
        self.spec = spec

    def start(
        self, session: Session, run_id: int, worker: str | None, now: datetime | None = None
    ) -> Started | Busy | Skipped:
        """Take run `run_id` for a new attempt and commit. A running run is taken over from
        the same `worker` at once, from another only once its heartbeat is older than
        `LIVE_HEARTBEAT_S` (that worker is gone); one that has had `MAX_ATTEMPTS` starts fails
        instead."""
        model, now = self.model, now or utcnow()
        run = session.get(model, run_id, populate_existing=True)
        if run is None or run.status not in UNFINISHED:
            return Skipped(run_id, None if run is None else run.status)
        # the same worker's earlier attempt is over (its process died, or the task is retrying)
        if run.status == "running" and (worker is None or run.worker != worker):
            last = run.heartbeat_at or run.started_at
            if last is not None and now - last < timedelta(seconds=LIVE_HEARTBEAT_S):
                return Busy(run_id, LIVE_HEARTBEAT_S - (now - last).total_seconds() + 1.0)
        if run.attempts >= MAX_ATTEMPTS:
            reason = f"gave up after {run.attempts} attempts (the last one's worker was lost)"
            self.fail(session, run_id, reason, now=now)
            return Skipped(run_id, "failed")
        attempt = run.attempts + 1
        taken = session.execute(
            update(model)
            .where(model.id == run_id, model.status.in_(UNFINISHED), model.attempts == run.attempts)
            .values(
                status="running",
                attempts=attempt,
                worker=worker,
                started_at=now,
                heartbeat_at=now,
                finished_at=None,
                error=None,
                **self.on_start,
            )
        ).rowcount
        session.commit()
        if not taken:  # another worker took it between our read and write
            session.expire_all()
            return self.start(session, run_id, worker, now)
        return Started(run_id, attempt, self.spec(run))

    def owned(self, run_id: int, attempt: int) -> tuple:
        model = self.model
        return (model.id == run_id, model.status == "running", model.attempts == attempt)

    def write(self, session: Session, run_id: int, attempt: int, values: dict[str, Any]) -> bool:
        """Set `values` on the run if it is still `attempt`'s, and commit; False if not."""
        owned = session.execute(
            update(self.model).where(*self.owned(run_id, attempt)).values(values)
        )
        session.commit()
        return bool(owned.rowcount)

    def progress(
        self,
        session: Session,
        run_id: int,
        attempt: int,
        values: dict[str, Any],
        now: datetime | None = None,
    ) -> bool:
        """Write the attempt's progress `values` (none: only the heartbeat) and heartbeat, and
        commit. False: the run is no longer this attempt's."""
        return self.write(session, run_id, attempt, {"heartbeat_at": now or utcnow(), **values})

    def finish(
        self,
        session: Session,
        run_id: int,
        attempt: int,
        result: dict[str, Any],
        now: datetime | None = None,
    ) -> bool:
        """Store what the attempt returned (`on_finish`) and mark the run `done`. False: the
        run is no longer the attempt's."""
        now = now or utcnow()
        ended = {"status": self.done, "finished_at": now, "heartbeat_at": now}
        return self.write(session, run_id, attempt, self.on_finish(result) | ended)

    def fail(
        self,
        session: Session,
        run_id: int,
        error: str,
        attempt: int | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Mark the run failed with `error`: if it is `attempt`'s (None: whatever attempt, as
        long as it is queued or running). False: it was over already, or taken over."""
        model = self.model
        where = (
            self.owned(run_id, attempt)
            if attempt is not None
            else (model.id == run_id, model.status.in_(UNFINISHED))
        )
        owned = session.execute(
            update(model)
            .where(*where)
            .values(status="failed", error=error, finished_at=now or utcnow(), **self.on_fail)
        )
        session.commit()
        return bool(owned.rowcount)

    def sweep(self, session: Session, stale_after_s: float, now: datetime | None = None) -> list:
        """Fail the running runs with no heartbeat for `stale_after_s` ("worker lost"); their
        ids."""
        model, now = self.model, now or utcnow()
        cutoff = now - timedelta(seconds=stale_after_s)
        last = func.coalesce(model.heartbeat_at, model.started_at, model.created_at)
        stale = session.execute(
            select(model.id, model.attempts).where(model.status == "running", last < cutoff)
        ).all()
        swept = []
        for run_id, attempt in stale:
            reason = f"worker lost: no heartbeat for {stale_after_s:g} s (attempt {attempt})"
            if self.fail(session, run_id, reason, attempt=attempt, now=now):
                swept.append(run_id)
        return swept
