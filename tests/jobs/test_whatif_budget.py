"""A what-if run on a worker is held to its bounds (issue 47, item 11), called without a
worker on both store backends: a replay that runs past its seconds is stopped and the run
failed saying why; the worker's default replay takes `JUNCTION_WHATIF_MAX_BYTES` and refuses a
run whose estimate is over it, the run failed naming the setting. A run in bounds is done
(`test_whatif_runs`, `test_whatif_worker`)."""

from __future__ import annotations

import time

import pytest

from api.settings import get_settings
from jobs import whatif
from tests.jobs.test_whatif_runs import engine_run, load, queue, sessions  # noqa: F401
from whatif.budget import Limits, WhatIfTimedOut, WhatIfTooLarge
from whatif.run import run_whatif


def test_a_run_past_its_seconds_is_stopped_and_failed_saying_why(sessions, engine_run):  # noqa: F811
    """The replay itself is real; the machine is slow (each progress report takes 0.2 s), so
    a run estimated well under its 0.5 s takes longer, and the deadline stops it."""
    run_id = queue(sessions, engine_run, [{"eviction": "lru"}, {"mode": "vllm"}])

    def slow_machine(recording, settings, progress):
        def slow(done: int, total: int) -> None:
            progress(done, total)
            time.sleep(0.2)

        return run_whatif(recording, settings, slow, limits=Limits(max_seconds=0.5))

    started = time.monotonic()
    with pytest.raises(WhatIfTimedOut):
        whatif.run_whatif_run(run_id, sessions=sessions, runner=slow_machine)
    assert time.monotonic() - started < 10  # stopped, not run out (24 reports: 4.8 s at least)
    run = load(sessions, run_id)
    assert (run.status, run.result) == ("failed", None)
    assert run.error.startswith("WhatIfTimedOut: what-if run stopped after ")
    assert "past JUNCTION_WHATIF_MAX_SECONDS (0.5 s)" in run.error
    assert 0 < run.progress_done < run.progress_total


def test_the_worker_holds_a_run_to_max_bytes(sessions, engine_run, monkeypatch):  # noqa: F811
    monkeypatch.setenv("JUNCTION_WHATIF_MAX_BYTES", "1000000")
    get_settings.cache_clear()
    try:
        run_id = queue(sessions, engine_run, [{"label": "big", "num_blocks": 4096}])
        with pytest.raises(WhatIfTooLarge):
            whatif.run_whatif_run(run_id, sessions=sessions)
    finally:
        get_settings.cache_clear()
    run = load(sessions, run_id)
    assert run.status == "failed" and run.progress_done == 0
    assert run.error.startswith("WhatIfTooLarge: what-if run refused: it would hold about ")
    assert "over JUNCTION_WHATIF_MAX_BYTES (1.0 MB); its largest setting, 'big'" in run.error
