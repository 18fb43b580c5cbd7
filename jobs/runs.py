"""What the tasks do, as plain functions that run without a worker: run one benchmark run
(progress and a heartbeat written to the store as it goes), submit the standard suite; and for
every kind of run (benchmark runs, what-if runs: `jobs.whatif`), one attempt at a run, the
failure of a task that gave up, and the sweep of the runs whose worker was lost.

The store is `api.runs.benchmarks` over `JUNCTION_DATABASE_URL` (or the `sessions` given).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, NamedTuple

from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from api.runs import benchmarks as store
from api.runs.lifecycle import Busy, RunLife, Send, Skipped, Started
from api.runs.specs import standard_suite
from api.settings import get_settings
from api.store.db import make_engine, make_sessionmaker

log = logging.getLogger(__name__)

#: Progress reaches the store at most this often; the last word always does.
PROGRESS_EVERY_S = 0.5
#: A running run's worker writes a heartbeat this often, progress or not.
HEARTBEAT_S = 30.0
#: The sweep fails a running run with no heartbeat for this long ("worker lost").
STALE_AFTER_S = 600.0
#: The store went away for a moment: the task retries these (a few times).
TRANSIENT_ERRORS = (OperationalError, InterfaceError)
MAX_ERROR_CHARS = 4000

Sessions = sessionmaker[Session]
#: `run_benchmark(spec, progress)`, as `bench` has it.
Runner = Callable[..., dict[str, Any]]


class Done(NamedTuple):
    """The run ended: `status` "finished", or "superseded" when another attempt (or the sweep)
    had taken it over by then, so this one's results were not kept."""

    run_id: int
    status: str


class RunTakenOver(RuntimeError):
    """The run is no longer this attempt's: stop working on it."""


@lru_cache(maxsize=4)
def _sessions(database_url: str) -> Sessions:
    return make_sessionmaker(make_engine(database_url))


def store_sessions(database_url: str | None = None) -> Sessions:
    """Sessions on `database_url` (default: the settings'), one engine per URL and process."""
    return _sessions(database_url or get_settings().database_url)


def describe(exc: BaseException) -> str:
    """`"ExceptionType: message"`, as a failed run records it."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class Reporter:
    """The progress callback of one attempt: writes (fraction, message) at most every
    `every_s`, and from a thread of its own a heartbeat every `heartbeat_s` while the run
    lasts (a long step sends no progress, but its worker is alive). Raises `RunTakenOver`
    from the callback once a write finds the run taken away; store errors are logged, not
    raised (progress is a courtesy; the final write is what counts). `what` names the run in
    messages; `write` is the store's write (a subclass's for other runs: `jobs.whatif`)."""

    what = "benchmark run"

    def __init__(
        self,
        sessions: Sessions,
        run_id: int,
        attempt: int,
        every_s: float = PROGRESS_EVERY_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.sessions, self.run_id, self.attempt = sessions, run_id, attempt
        self.every_s, self.heartbeat_s = every_s, heartbeat_s
        self.is_lost = False
        self.num_writes = 0
        self._pending: tuple[float, str] | None = None
        self._last_write = float("-inf")
        self._lock = threading.Lock()  # one write at a time, in order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, fraction: float, message: str = "") -> None:
        if self.is_lost:
            raise RunTakenOver(f"{self.what} {self.run_id} was taken over")
        self._pending = (fraction, message)
        if time.monotonic() - self._last_write >= self.every_s:
            self.flush()
        if self.is_lost:
            raise RunTakenOver(f"{self.what} {self.run_id} was taken over")

    def flush(self) -> None:
        """Write the latest progress (or only the heartbeat, when there is none)."""
        with self._lock:
            pending, self._pending = self._pending, None
            self._last_write = time.monotonic()
            fraction, message = pending if pending is not None else (None, None)
            try:
                with self.sessions() as session:
                    owned = self.write(session, fraction, message)
            except SQLAlchemyError as exc:
                log.warning("%s %s: progress not written: %s", self.what, self.run_id, exc)
                return
            self.num_writes += 1
            self.is_lost = self.is_lost or not owned

    def write(self, session: Session, fraction: Any, message: str | None) -> bool:
        """Write the progress (None: only the heartbeat); False: the run was taken over."""
        return store.record_progress(session, self.run_id, self.attempt, fraction, message)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.flush()

    def __enter__(self) -> Reporter:
        self._thread = threading.Thread(
            target=self._beat, name=f"heartbeat-run-{self.run_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def run_benchmark_run(
    run_id: int,
    *,
    sessions: Sessions | None = None,
    worker: str | None = None,
    runner: Runner | None = None,
    progress_every_s: float = PROGRESS_EVERY_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> Done | Busy | Skipped:
    """Run benchmark run `run_id`: take it (`RunLife.start`), replay its spec with
    `runner` (default `bench.run_benchmark`) writing progress, then store the results.

    A spec or benchmark that raises marks the run failed with `describe(exc)` and re-raises;
    store errors (`TRANSIENT_ERRORS`) propagate for the task to retry. `Busy`: another
    worker's attempt is alive; `Skipped`: nothing to do (gone, finished or failed)."""

    def work(taken: Started, reporter: Reporter) -> dict:
        from bench import BenchmarkSpec, run_benchmark

        spec = BenchmarkSpec.model_validate(taken.spec)
        return (runner or run_benchmark)(spec, progress=reporter)

    reporter = partial(Reporter, every_s=progress_every_s, heartbeat_s=heartbeat_s)
    return run_attempt(store.LIFE, run_id, worker, sessions or store_sessions(), reporter, work)


def run_attempt(
    life: RunLife,
    run_id: int,
    worker: str | None,
    sessions: Sessions,
    reporter: Callable[..., Reporter],
    work: Callable[[Any, Reporter], dict],
) -> Done | Busy | Skipped:
    """One attempt at a run of `life`'s kind: take it, `work(taken, reporter)` with a heartbeat
    going, then store what it returns and mark it `life.done`. What `work` raises marks the
    run failed with `describe(exc)` and is raised again; store errors (`TRANSIENT_ERRORS`)
    propagate for the task to retry; a run taken over meanwhile is left to its new attempt."""
    kind = life.what
    with sessions() as session:
        taken = life.start(session, run_id, worker)
    if not isinstance(taken, Started):
        return taken
    log.info("%s %s: attempt %s started", kind, run_id, taken.attempt)
    try:
        with reporter(sessions, run_id, taken.attempt) as beating:
            result = work(taken, beating)
    except RunTakenOver:
        log.warning("%s %s: attempt %s was taken over", kind, run_id, taken.attempt)
        return Done(run_id, "superseded")
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:
        reason = describe(exc)
        log.warning("%s %s failed: %s", kind, run_id, reason)
        with sessions() as session:
            life.fail(session, run_id, reason, attempt=taken.attempt)
        raise
    with sessions() as session:
        owned = life.finish(session, run_id, taken.attempt, result)
    log.info("%s %s: attempt %s %s", kind, run_id, taken.attempt, life.done)
    return Done(run_id, life.done if owned else "superseded")


def record_failure(
    life: RunLife, run_id: int, exc: BaseException, sessions: Sessions | None = None
) -> bool:
    """Mark the run of `life`'s kind failed with `exc` unless it is over already (a task that
    gave up: retries spent, or an error outside the run). Best effort: the sweep is the
    backstop."""
    try:
        with (sessions or store_sessions())() as session:
            return life.fail(session, run_id, describe(exc))
    except SQLAlchemyError as error:
        log.error("%s %s: could not record its failure (%s): %s", life.what, run_id, exc, error)
        return False


def enqueue_suite(send: Send, sessions: Sessions | None = None) -> list[int]:
    """A queued run of each spec of the standard suite, each sent with `send`; their ids."""
    sessions = sessions or store_sessions()
    run_ids = []
    for spec in standard_suite():
        with sessions() as session:
            run_ids.append(store.submit_run(session, spec, spec["name"], send).id)
    return run_ids


def sweep_stale_runs(
    life: RunLife, stale_after_s: float = STALE_AFTER_S, sessions: Sessions | None = None
) -> list[int]:
    """Fail the running runs of `life`'s kind with no heartbeat for `stale_after_s` ("worker
    lost"); their ids."""
    with (sessions or store_sessions())() as session:
        swept = life.sweep(session, stale_after_s)
    if swept:
        log.warning("%ss %s: worker lost, marked failed", life.what, swept)
    return swept
