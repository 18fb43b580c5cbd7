"""What a what-if task does, called without a worker, on both store backends: a queued run
over a real ledger engine's recording writes its progress (at most once a second), then its
report; a replay that raises fails the run with the reason; a run is taken once; a lost one
is swept."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from api.store.db import make_engine, make_sessionmaker
from api.store.models import WhatIfRun, utcnow
from api.whatif import runs as store
from engine.engine import Engine
from jobs import runs, whatif
from jobs.runs import Done
from tests.api import factories
from whatif.recording import Recording
from whatif.report import SettingResult, WhatIfReport


@pytest.fixture(scope="module")
def engine_run() -> Engine:
    return factories.run_engine(engine_id="whatif-jobs")


@pytest.fixture
def sessions(database_url: str, engine_run: Engine) -> Iterator[sessionmaker[Session]]:
    """Sessions on a store that holds the engine's recorded requests."""
    db = make_engine(database_url)
    made = make_sessionmaker(db)
    with made() as session:
        factories.ingest(session, engine_run)
    yield made
    db.dispose()


def queue(sessions: sessionmaker[Session], engine: Engine, settings: list[dict]) -> int:
    with sessions() as session:
        run = store.submit_run(
            session, engine.engine_id, engine.epoch, settings, lambda *_: None, 100
        )
        return run.id


def load(sessions: sessionmaker[Session], run_id: int) -> WhatIfRun:
    with sessions() as session:
        return session.get(WhatIfRun, run_id)


def result(label: str, recording: Recording, hits: int) -> SettingResult:
    return SettingResult(label, {}, {}, recording.num_prompt_tokens, hits, hits, hits)


def test_a_run_writes_progress_then_its_report(sessions, engine_run):
    run_id = queue(sessions, engine_run, [{"eviction": "lru"}, {"label": "x", "mode": "vllm"}])
    seen = []

    def runner(recording: Recording, settings, progress):  # watched from the store
        assert [s.name() for s in settings] == ["lru", "x"]
        assert recording.unit == 16 and recording.num_requests == 8
        total = recording.num_requests * 3
        for done in range(0, total + 1, 4):
            progress(done, total)
            run = load(sessions, run_id)
            seen.append((run.status, run.progress_done, run.progress_total))
        ran = result("as ran", recording, recording.num_cached_tokens)
        return WhatIfReport(
            recording.num_requests,
            recording.num_prompt_tokens,
            recording.num_cached_tokens,
            recording.num_requests,
            ran,
            [result(s.name(), recording, 10 * i) for i, s in enumerate(settings)],
        )

    outcome = whatif.run_whatif_run(
        run_id, sessions=sessions, worker="w1", runner=runner, progress_every_s=0.0
    )
    assert outcome == Done(run_id, "done")
    assert {status for status, _, _ in seen} == {"running"}
    assert (seen[1][1], seen[1][2]) == (4, 24)  # progress reached the store as it went
    run = load(sessions, run_id)
    assert (run.status, run.attempts, run.worker, run.error) == ("done", 1, "w1", None)
    assert (run.progress_done, run.progress_total) == (24, 24)
    report = run.result
    assert report["exact"] and report["num_requests"] == 8
    assert [r["label"] for r in report["results"]] == ["x", "lru"]  # most saved first
    assert run.finished_at is not None and run.started_at <= run.finished_at
    # done is done: a redelivered message finds nothing to do
    assert whatif.run_whatif_run(run_id, sessions=sessions, runner=runner) == (
        store.Skipped(run_id, "done")
    )


def test_progress_is_throttled(sessions, engine_run):
    run_id = queue(sessions, engine_run, [{}])
    writes = []

    def runner(recording, settings, progress):
        for done in range(1000):
            progress(done, 1000)
        writes.append(reporter_writes())
        raise RuntimeError("stop here")

    def reporter_writes() -> int:
        return load(sessions, run_id).progress_done

    with pytest.raises(RuntimeError):
        whatif.run_whatif_run(run_id, sessions=sessions, runner=runner)
    assert writes == [0]  # the first call wrote; the rest came within the second


def test_a_replay_that_raises_fails_the_run_with_the_reason(sessions, engine_run):
    run_id = queue(sessions, engine_run, [{"num_blocks": 1}])

    def runner(recording, settings, progress):
        raise ValueError("what-if setting 'blocks 1': 1 block cannot hold a request")

    with pytest.raises(ValueError):
        whatif.run_whatif_run(run_id, sessions=sessions, runner=runner)
    run = load(sessions, run_id)
    assert run.status == "failed" and run.result is None
    assert run.error == "ValueError: what-if setting 'blocks 1': 1 block cannot hold a request"


def test_a_recording_gone_fails_the_run(sessions, engine_run):
    run_id = queue(sessions, engine_run, [{}])
    with sessions() as session:
        session.get(WhatIfRun, run_id).epoch = 99
        session.commit()
    with pytest.raises(LookupError):
        whatif.run_whatif_run(run_id, sessions=sessions, runner=lambda *a: None)
    assert "no recorded request chains in epoch 99" in load(sessions, run_id).error


def test_a_lost_run_is_swept_and_a_live_one_is_not_taken(sessions, engine_run):
    lost, live = queue(sessions, engine_run, [{}]), queue(sessions, engine_run, [{}])
    with sessions() as session:
        assert isinstance(store.LIFE.start(session, lost, "w1"), store.Started)
        assert isinstance(store.LIFE.start(session, live, "w1"), store.Started)
        assert isinstance(store.LIFE.start(session, live, "w2"), store.Busy)  # w1 is alive
        session.get(WhatIfRun, lost).heartbeat_at = utcnow() - timedelta(hours=1)
        session.commit()
    assert runs.sweep_stale_runs(store.LIFE, stale_after_s=600, sessions=sessions) == [lost]
    run = load(sessions, lost)
    assert run.status == "failed" and run.error.startswith("worker lost: no heartbeat")
    assert load(sessions, live).status == "running"
    assert runs.record_failure(store.LIFE, live, RuntimeError("gave up"), sessions=sessions)
    assert load(sessions, live).error == "RuntimeError: gave up"
