"""The Celery tasks: thin wrappers of `jobs.runs`, named as `api.runs.broker` sends them and
`jobs.app` schedules them.

`run_benchmark` is acked late and rejected (so redelivered) when its worker process dies; it
retries the store's transient errors a few times; a run whose task gives up is marked failed
with the reason (`on_failure`), and one whose worker vanished is failed by the sweep.
`run_whatif` is the same for a what-if run (`jobs.whatif`): one `RunTask`, its `life` the
kind of run; the sweep takes both kinds.
"""

from __future__ import annotations

from typing import Any

from celery import Task

from api.runs import benchmarks
from api.runs.broker import TASK_RUN, TASK_WHATIF
from api.runs.lifecycle import Busy, RunLife
from api.whatif import runs as whatif_runs
from jobs import runs, whatif
from jobs.app import TASK_SUITE, TASK_SWEEP, app

#: Looks at a run another worker holds before leaving it to that worker.
BUSY_MAX_RETRIES = 5


class RunTask(Task):
    """A run task: `life` is its kind of run (a `RunLife`); a run whose task gives up is
    marked failed with the reason."""

    life: RunLife

    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        run_id = args[0] if args else kwargs.get("run_id")
        if run_id is not None:
            runs.record_failure(self.life, int(run_id), exc)


#: What every run task is: acked late and redelivered when its worker dies, retrying the
#: store's transient errors a few times.
RUN_TASK = {
    "base": RunTask,
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": runs.TRANSIENT_ERRORS,
    "max_retries": 2,
    "retry_backoff": 5,
    "retry_backoff_max": 60,
}


def _outcome(task: Task, run_id: int, outcome: Any) -> dict[str, Any]:
    """A run's outcome as the task's result; `Busy` (another worker's attempt is alive) is
    looked at again later, a few times, then left to that attempt (the sweep watches it)."""
    if isinstance(outcome, Busy):
        if task.request.retries < BUSY_MAX_RETRIES:
            raise task.retry(countdown=outcome.retry_in_s, max_retries=BUSY_MAX_RETRIES)
        return {"run_id": run_id, "status": "busy"}
    return outcome._asdict()


@app.task(name=TASK_RUN, life=benchmarks.LIFE, **RUN_TASK)
def run_benchmark(self: Task, run_id: int) -> dict[str, Any]:
    return _outcome(self, run_id, runs.run_benchmark_run(run_id, worker=self.request.hostname))


@app.task(name=TASK_WHATIF, life=whatif_runs.LIFE, **RUN_TASK)
def run_whatif(self: Task, run_id: int) -> dict[str, Any]:
    return _outcome(self, run_id, whatif.run_whatif_run(run_id, worker=self.request.hostname))


@app.task(name=TASK_SUITE)
def enqueue_suite() -> list[int]:
    return runs.enqueue_suite(
        lambda run_id, task_id: run_benchmark.apply_async(args=[run_id], task_id=task_id)
    )


@app.task(name=TASK_SWEEP)
def sweep_stale_runs(stale_after_s: float = runs.STALE_AFTER_S) -> dict[str, list[int]]:
    """Fail the benchmark and what-if runs whose worker was lost; their ids by kind."""
    return {
        "benchmarks": runs.sweep_stale_runs(benchmarks.LIFE, stale_after_s),
        "whatif": runs.sweep_stale_runs(whatif_runs.LIFE, stale_after_s),
    }
