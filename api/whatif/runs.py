"""What-if runs in the store: submit one (a queued row, then its Celery message), list them,
and a run's life on a worker: its progress (`record_progress`), and start, done, failed and
the sweep of lost runs, every kind of run's (`LIFE`, an `api.runs.lifecycle.RunLife`).

A run goes queued -> running -> done | failed and never leaves done or failed. As a benchmark
run's (`api.runs.benchmarks`), every write a worker makes is fenced by its attempt number, so
no stale worker overwrites what a newer attempt (or the sweep) decided. The table is bounded:
past `JUNCTION_WHATIF_MAX_RUNS` rows a submit deletes the oldest finished runs, and refuses a
new run (`TooManyRuns`) when that many are still queued or running.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from api.runs.lifecycle import UNFINISHED as UNFINISHED
from api.runs.lifecycle import Busy as Busy
from api.runs.lifecycle import RunLife, Send, queue
from api.runs.lifecycle import Skipped as Skipped
from api.runs.lifecycle import Started as Started
from api.store.models import WhatIfRun
from api.store.paging import fetch_page

FINISHED = ("done", "failed")
#: A what-if run's life on a worker: `LIFE.start` (`Started.spec` is `{"engine_id", "epoch",
#: "settings"}`), `LIFE.finish` (its report), `LIFE.fail`, `LIFE.sweep` (`RunLife`); its
#: progress is `record_progress`.
LIFE = RunLife(
    WhatIfRun,
    what="what-if run",
    done="done",
    on_start={"progress_done": 0},
    on_finish=lambda result: {"result": result, "progress_done": WhatIfRun.progress_total},
    on_fail={},
    spec=lambda run: {
        "engine_id": run.engine_id,
        "epoch": run.epoch,
        "settings": list(run.settings),
    },
)


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
    (`lifecycle.queue`: if sending fails the row goes again and the error is raised). Makes
    room first: the oldest finished runs past `max_runs - 1` go; `TooManyRuns` when the
    unfinished fill it."""
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
    return queue(session, run, send)


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


def record_progress(
    session: Session,
    run_id: int,
    attempt: int,
    progress: tuple[int, int] | None = None,
    now: datetime | None = None,
) -> bool:
    """Write the attempt's `progress` (requests replayed, of how many) and heartbeat; only the
    heartbeat when None. False: the run is no longer this attempt's."""
    values: dict[str, Any] = {}
    if progress is not None:
        values["progress_done"], values["progress_total"] = progress
    return LIFE.progress(session, run_id, attempt, values, now)
