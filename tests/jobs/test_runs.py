"""The plain functions behind the tasks, called without a worker, on both store backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from api.runs import benchmarks as store
from api.store.db import make_engine, make_sessionmaker
from api.store.models import BenchmarkRun, utcnow
from bench import STANDARD_SUITE
from jobs import runs
from tests.jobs.specs import MISSING_WEIGHTS, missing_weights_spec, tiny_spec


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    db = make_engine(database_url)
    yield make_sessionmaker(db)
    db.dispose()


def queue(sessions: sessionmaker[Session], spec: dict[str, Any] | None = None) -> int:
    spec = spec or tiny_spec()
    with sessions() as session:
        return store.submit_run(session, spec, spec["name"], lambda run_id, task_id: None).id


def load(sessions: sessionmaker[Session], run_id: int) -> BenchmarkRun:
    with sessions() as session:
        return session.get(BenchmarkRun, run_id)


def test_a_run_writes_progress_then_its_results(sessions: sessionmaker[Session]) -> None:
    run_id = queue(sessions)
    seen: list[tuple[str, float]] = []

    def runner(spec, progress):  # the real benchmark, watched from the store as it goes
        from bench import run_benchmark

        def watched(fraction: float, message: str) -> None:
            progress(fraction, message)
            run = load(sessions, run_id)
            seen.append((run.status, run.progress))

        return run_benchmark(spec, progress=watched)

    outcome = runs.run_benchmark_run(
        run_id, sessions=sessions, worker="w1", runner=runner, progress_every_s=0.0
    )
    assert outcome == runs.Done(run_id, "finished")
    assert {status for status, _ in seen} == {"running"}
    assert any(0 < fraction < 1 for _, fraction in seen)  # progress reached the store
    run = load(sessions, run_id)
    assert (run.status, run.progress, run.attempts, run.worker) == ("finished", 1.0, 1, "w1")
    assert run.started_at <= run.finished_at and run.error is None
    modes = [row["mode"] for row in run.results["modes"]]
    assert modes == ["off", "partial", "junction_inline", "pins"]
    assert run.results["modes"][0]["hit_rate"] == 0.0  # cache off
    # a second delivery of the message finds it finished and leaves it alone
    again = runs.run_benchmark_run(run_id, sessions=sessions, worker="w2")
    assert again == store.Skipped(run_id, "finished")


def test_progress_is_throttled_and_the_heartbeat_beats(sessions: sessionmaker[Session]) -> None:
    run_id = queue(sessions)
    with sessions() as session:
        started = store.LIFE.start(session, run_id, "w1")
    reporter = runs.Reporter(sessions, run_id, started.attempt, every_s=60.0, heartbeat_s=0.05)
    with reporter:
        for step in range(1000):
            reporter(step / 1000, f"step {step}")
        before = load(sessions, run_id).heartbeat_at
        deadline = utcnow() + timedelta(seconds=10)
        while load(sessions, run_id).heartbeat_at == before and utcnow() < deadline:
            pass
    assert 2 <= reporter.num_writes < 1000
    run = load(sessions, run_id)
    assert run.heartbeat_at > before
    # the heartbeat also flushes the last progress the throttle held back
    assert (run.progress, run.progress_message) == (0.999, "step 999")


def test_a_run_that_raises_is_failed_with_the_reason(sessions: sessionmaker[Session]) -> None:
    run_id = queue(sessions, missing_weights_spec())
    with pytest.raises(FileNotFoundError):
        runs.run_benchmark_run(run_id, sessions=sessions, worker="w1")
    run = load(sessions, run_id)
    assert run.status == "failed" and run.finished_at is not None and run.results is None
    assert run.error.startswith("FileNotFoundError: ") and MISSING_WEIGHTS in run.error
    # the task's on_failure records again: a no-op, the first reason stays
    assert not runs.record_failure(store.LIFE, run_id, RuntimeError("later"), sessions=sessions)
    assert load(sessions, run_id).error.startswith("FileNotFoundError")


def test_a_task_that_gives_up_fails_its_run(sessions: sessionmaker[Session]) -> None:
    run_id = queue(sessions)
    assert runs.record_failure(store.LIFE, run_id, ConnectionError("store gone"), sessions=sessions)
    run = load(sessions, run_id)
    assert (run.status, run.error) == ("failed", "ConnectionError: store gone")


def test_a_lost_worker_is_swept_and_its_late_results_dropped(
    sessions: sessionmaker[Session],
) -> None:
    lost, live = queue(sessions), queue(sessions)
    long_ago = utcnow() - timedelta(minutes=30)
    with sessions() as session:
        dead = store.LIFE.start(session, lost, "w-dead", now=long_ago)
        store.LIFE.start(session, live, "w-live")
    assert runs.sweep_stale_runs(store.LIFE, stale_after_s=600, sessions=sessions) == [lost]
    run = load(sessions, lost)
    assert run.status == "failed" and run.error.startswith("worker lost: no heartbeat for 600 s")
    assert load(sessions, live).status == "running"
    with sessions() as session:  # the lost attempt comes back: its writes are fenced out
        assert not store.LIFE.finish(session, lost, dead.attempt, {"modes": []})
        assert not store.record_progress(session, lost, dead.attempt, 0.5, "late")
    assert load(sessions, lost).status == "failed"
    reporter = runs.Reporter(sessions, lost, dead.attempt, every_s=0.0)
    with pytest.raises(runs.RunTakenOver):
        reporter(0.5, "late")


def test_a_redelivered_run_waits_for_a_live_worker_and_retakes_a_dead_one(
    sessions: sessionmaker[Session],
) -> None:
    run_id = queue(sessions)
    with sessions() as session:
        first = store.LIFE.start(session, run_id, "w1")
        assert isinstance(store.LIFE.start(session, run_id, "w2"), store.Busy)
        # the same worker's earlier attempt is over (its process died): taken at once
        second = store.LIFE.start(session, run_id, "w1")
        assert second.attempt == first.attempt + 1
        later = utcnow() + timedelta(seconds=store.LIVE_HEARTBEAT_S + 1)
        third = store.LIFE.start(session, run_id, "w2", now=later)
        assert third.attempt == 3
        assert not store.record_progress(session, run_id, second.attempt, 0.2, "stale")
        # every start was lost: the next one gives up and fails the run
        much_later = later + timedelta(seconds=store.LIVE_HEARTBEAT_S + 1)
        gave_up = store.LIFE.start(session, run_id, "w3", now=much_later)
    assert gave_up == store.Skipped(run_id, "failed")
    assert "gave up after 3 attempts" in load(sessions, run_id).error


def between_read_and_write(
    sessions: sessionmaker[Session], other: Callable[[], object]
) -> Callable[[], Session]:
    """Sessions like `sessions`, but the first UPDATE any of them runs waits until `other()`
    (another worker's whole start, in its own session) has run and committed: the other
    worker takes the run after this one read it and before this one writes."""
    waiting = [other]

    def make() -> Session:
        session = sessions()

        @event.listens_for(session, "do_orm_execute")
        def _interleave(state) -> None:
            if state.is_update and waiting:
                waiting.pop()()

        return session

    return make


@pytest.mark.parametrize("num_lost", [0, 1, 2], ids=["first start", "takeover", "last attempt"])
def test_of_two_racing_starts_one_takes_the_run_and_the_other_is_told_busy(
    sessions: sessionmaker[Session], num_lost: int
) -> None:
    """Two workers start the same run (a message delivered twice, or two workers taking over
    from a lost one) and both read it before either writes: the `attempts` fence lets only
    the first write through; the second reads the run again and finds the winner alive."""
    run_id = queue(sessions)
    long_ago = utcnow() - timedelta(minutes=30)
    with sessions() as session:  # `num_lost` attempts by a worker that died long ago
        for _ in range(num_lost):
            dead = store.LIFE.start(session, run_id, "w-dead", now=long_ago)
            assert isinstance(dead, store.Started)
    now = utcnow()
    won: list[object] = []

    def winner_starts() -> None:
        with sessions() as session:
            won.append(store.LIFE.start(session, run_id, "w-a", now=now))

    with between_read_and_write(sessions, winner_starts)() as session:
        lost = store.LIFE.start(session, run_id, "w-b", now=now)
    assert won == [store.Started(run_id, num_lost + 1, tiny_spec())]
    assert isinstance(lost, store.Busy) and lost.run_id == run_id, lost
    assert lost.retry_in_s == pytest.approx(store.LIVE_HEARTBEAT_S + 1.0)
    run = load(sessions, run_id)
    assert (run.status, run.attempts, run.worker) == ("running", num_lost + 1, "w-a")
    # the winner's attempt owns the run: its writes land
    with sessions() as session:
        assert store.record_progress(session, run_id, num_lost + 1, 0.5, "halfway")
        assert store.LIFE.finish(session, run_id, num_lost + 1, {"modes": []})
    assert load(sessions, run_id).status == "finished"


def test_a_worker_that_loses_the_race_runs_nothing(sessions: sessionmaker[Session]) -> None:
    """The task's function, raced the same way: the loser returns `Busy` (the task retries it
    later) and never runs the benchmark."""
    run_id = queue(sessions)

    def winner_starts() -> None:
        with sessions() as session:
            assert store.LIFE.start(session, run_id, "w-a").attempt == 1

    def runner(spec, progress):
        raise AssertionError("the losing worker ran the benchmark")

    raced = between_read_and_write(sessions, winner_starts)
    outcome = runs.run_benchmark_run(run_id, sessions=raced, worker="w-b", runner=runner)
    assert isinstance(outcome, store.Busy), outcome
    run = load(sessions, run_id)
    assert (run.status, run.attempts, run.worker) == ("running", 1, "w-a")


def test_a_message_that_cannot_be_sent_leaves_no_run(sessions: sessionmaker[Session]) -> None:
    def unreachable(run_id: int, task_id: str) -> None:
        raise store.BrokerUnavailable("broker down")

    with sessions() as session, pytest.raises(store.BrokerUnavailable):
        store.submit_run(session, tiny_spec(), "tiny", unreachable)
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(BenchmarkRun)) == 0


def test_the_suite_queues_a_run_per_standard_spec(sessions: sessionmaker[Session]) -> None:
    sent: list[tuple[int, str]] = []
    run_ids = runs.enqueue_suite(lambda run_id, task_id: sent.append((run_id, task_id)), sessions)
    assert [run_id for run_id, _ in sent] == run_ids and len(run_ids) == len(STANDARD_SUITE)
    with sessions() as session:
        rows = session.scalars(select(BenchmarkRun).order_by(BenchmarkRun.id)).all()
    assert [row.name for row in rows] == [spec.name for spec in STANDARD_SUITE]
    assert {row.status for row in rows} == {"queued"}
    assert [row.task_id for row in rows] == [task_id for _, task_id in sent]
