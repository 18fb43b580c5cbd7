"""Real workers: `junction worker` runs what `POST /api/v1/benchmarks` queued, and `GET` shows
the outcome. On Redis with `junction api` on PostgreSQL (compose, CI); on the embedded
default (Celery's SQLAlchemy transport and results on SQLite files, the store on SQLite)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from celery import Celery

from api.settings import Settings
from tests.api.conftest import TOKEN
from tests.api.processes import TOKEN as E2E_TOKEN
from tests.api.processes import ApiProcess
from tests.jobs.processes import WorkerProcess
from tests.jobs.specs import MISSING_WEIGHTS, missing_weights_spec, tiny_spec
from tests.polling import wait_for

URL = "/api/v1/benchmarks"
TERMINAL = ("finished", "failed")


def wait_until_done(
    get: Callable[[str], httpx.Response], run_id: int, worker: WorkerProcess, timeout_s=60.0
) -> tuple[dict, set[str]]:
    """The run once finished or failed, and every status seen on the way."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = get(f"{URL}/{run_id}").json()
        seen.add(run["status"])
        if run["status"] in TERMINAL:
            return run, seen
        assert worker.process.poll() is None, f"the worker died:\n{worker.log()}"
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} still {run['status']} after {timeout_s} s:\n{worker.log()}")


def test_a_redis_worker_runs_what_rest_queued(
    redis_stack: tuple[ApiProcess, WorkerProcess], redis_server: str
) -> None:
    api, worker = redis_stack
    auth = {"Authorization": f"Bearer {E2E_TOKEN}"}
    with httpx.Client(base_url=api.url, headers=auth, timeout=30) as http:
        good = http.post(URL, json=tiny_spec(), headers=auth)
        assert good.status_code == 201, good.text
        bad = http.post(URL, json=missing_weights_spec(), headers=auth)
        assert bad.status_code == 201, bad.text

        finished, seen = wait_until_done(http.get, good.json()["id"], worker)
        assert finished["status"] == "finished", finished["error"]
        assert seen <= {"queued", "running", "finished"}
        assert finished["progress"] == 1.0 and finished["attempts"] == 1
        assert finished["worker"] == worker.name
        modes = {row["mode"]: row for row in finished["results"]["modes"]}
        assert list(modes) == ["off", "partial", "junction_inline", "pins"]
        assert modes["off"]["hit_rate"] == 0 < modes["partial"]["hit_rate"]
        assert modes["pins"]["hit_rate"] <= modes["pins"]["oracle_hit_rate"] + 1e-9

        failed, _ = wait_until_done(http.get, bad.json()["id"], worker)
        assert failed["status"] == "failed" and failed["results"] is None
        assert failed["error"].startswith("FileNotFoundError: ")
        assert MISSING_WEIGHTS in failed["error"]

        listed = http.get(URL, params={"status": "failed"}).json()
        assert failed["id"] in [run["id"] for run in listed["runs"]]
        assert finished["id"] not in [run["id"] for run in listed["runs"]]

    # the result backend has the tasks' outcomes too
    results = Celery(broker=redis_server, backend=redis_server, set_as_current=False)
    try:
        assert results.AsyncResult(finished["task_id"]).state == "SUCCESS"
        assert results.AsyncResult(failed["task_id"]).state == "FAILURE"
    finally:
        results.close()


def test_a_short_run_queued_behind_a_long_one_is_not_kept_waiting(
    redis_stack: tuple[ApiProcess, WorkerProcess],
) -> None:
    """The worker as `junction up` starts it runs two runs at once: a small run posted while a
    long one runs finishes first (with one process it would wait for the long one)."""
    api, worker = redis_stack
    long = tiny_spec("long", modes=["off", "partial", "junction_inline"], concurrency=8)
    long["workload"] |= {"num_groups": 24, "prompts_per_group": 16, "system_prompt_len": 512}
    auth = {"Authorization": f"Bearer {E2E_TOKEN}"}
    with httpx.Client(base_url=api.url, headers=auth, timeout=30) as http:
        long_id = http.post(URL, json=long, headers=auth).json()["id"]
        wait_for(
            "the long run to start",
            lambda: http.get(f"{URL}/{long_id}").json()["status"] == "running",
        )
        short_id = http.post(URL, json=tiny_spec("short", modes=["off"]), headers=auth).json()["id"]
        short, _ = wait_until_done(http.get, short_id, worker)
        assert short["status"] == "finished", short["error"]
        assert http.get(f"{URL}/{long_id}").json()["status"] == "running", worker.log()
        done, _ = wait_until_done(http.get, long_id, worker, timeout_s=180)
    assert done["status"] == "finished", done["error"]


def test_a_worker_on_the_embedded_default(sqlite_template: Path, tmp_path: Path) -> None:
    """SQLite store, Celery's SQLAlchemy transport and database results: no server at all."""
    from fastapi.testclient import TestClient

    from api.main import create_app

    store = tmp_path / "junction.db"
    shutil.copyfile(sqlite_template, store)
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{store}",
        api_token=TOKEN,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        result_backend=f"db+sqlite:///{tmp_path / 'results.db'}",
    )
    env = {
        "JUNCTION_DATABASE_URL": settings.database_url,
        "JUNCTION_BROKER_URL": settings.broker_url,
        "JUNCTION_RESULT_BACKEND": settings.result_backend,
    }
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with TestClient(create_app(settings), headers=auth) as client:
            response = client.post(URL, json=tiny_spec("embedded"), headers=auth)
            assert response.status_code == 201, response.text
            worker.wait_ready()
            run, _ = wait_until_done(client.get, response.json()["id"], worker)
        assert run["status"] == "finished", run["error"]
        assert len(run["results"]["modes"]) == 4
    finally:
        worker.stop()
    with sqlite3.connect(tmp_path / "results.db") as db:
        [(state,)] = db.execute(
            "SELECT status FROM celery_taskmeta WHERE task_id = ?", (run["task_id"],)
        ).fetchall()
    assert state == "SUCCESS"


def test_a_run_whose_worker_process_dies_is_run_again(
    redis_stack: tuple[ApiProcess, WorkerProcess],
) -> None:
    """acks_late + reject_on_worker_lost: the killed pool process's message goes back to the
    queue, and the same worker takes the run over at once (attempt 2) and finishes it."""
    api, worker = redis_stack
    spec = tiny_spec("long", modes=["off", "partial"], concurrency=8)
    spec["workload"] |= {"num_groups": 16, "prompts_per_group": 16, "system_prompt_len": 512}
    auth = {"Authorization": f"Bearer {E2E_TOKEN}"}
    with httpx.Client(base_url=api.url, headers=auth, timeout=30) as http:
        run_id = http.post(URL, json=spec, headers=auth).json()["id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run = http.get(f"{URL}/{run_id}").json()
            if run["status"] == "running":  # killed as soon as it starts: surely mid-run
                break
            assert run["status"] in ("queued", "running"), run
            time.sleep(0.05)
        for child in worker.child_pids():  # the one running it, and the idle one
            os.kill(child, signal.SIGKILL)
        run, _ = wait_until_done(http.get, run_id, worker)
    assert (run["status"], run["attempts"], run["error"]) == ("finished", 2, None), worker.log()
    assert "WorkerLostError" in worker.log()
