"""Benchmark runs in the store: submit one (a queued row, then its Celery message), list them,
and a run's life on a worker: its progress (`record_progress`), and start, finish, fail and
the sweep of lost runs, every kind of run's (`LIFE`, an `api.runs.lifecycle.RunLife`).
A run goes queued -> running -> finished | failed, every write a worker makes fenced by its
attempt number.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api.runs.broker import BrokerUnavailable as BrokerUnavailable  # what a failed `send` raises
from api.runs.lifecycle import LIVE_HEARTBEAT_S as LIVE_HEARTBEAT_S
from api.runs.lifecycle import MAX_ATTEMPTS as MAX_ATTEMPTS
from api.runs.lifecycle import UNFINISHED as UNFINISHED
from api.runs.lifecycle import Busy as Busy
from api.runs.lifecycle import RunLife, Send, queue
from api.runs.lifecycle import Skipped as Skipped
from api.runs.lifecycle import Started as Started
from api.store.models import BenchmarkRun
from api.store.paging import fetch_page

#: A benchmark run's life on a worker: `LIFE.start`, `LIFE.finish` (its results), `LIFE.fail`,
#: `LIFE.sweep` (`RunLife`); its progress is `record_progress`.
LIFE = RunLife(
    BenchmarkRun,
    what="benchmark run",
    done="finished",
    on_start={"progress": 0.0, "progress_message": "starting"},
    on_finish=lambda results: {
        "results": results,
        "progress": 1.0,
        "progress_message": "finished",
    },
    on_fail={"progress_message": "failed"},
    spec=lambda run: dict(run.spec),
)


def submit_run(session: Session, spec: dict[str, Any], name: str, send: Send) -> BenchmarkRun:
    """A queued run of `spec`, committed, and its message sent (`lifecycle.queue`)."""
    run = BenchmarkRun(name=name, spec=spec, status="queued", task_id=str(uuid.uuid4()))
    return queue(session, run, send)


def list_runs(
    session: Session, status: str | None, limit: int, offset: int
) -> tuple[int, Sequence[BenchmarkRun]]:
    """(total, the page): newest first, `status` filters."""
    where = [] if status is None else [BenchmarkRun.status == status]
    order = (BenchmarkRun.created_at.desc(), BenchmarkRun.id.desc())
    return fetch_page(session, BenchmarkRun, where, order, offset, limit)


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
    values: dict[str, Any] = {}
    if fraction is not None:
        values["progress"] = min(max(float(fraction), 0.0), 1.0)
        values["progress_message"] = message
    return LIFE.progress(session, run_id, attempt, values, now)
