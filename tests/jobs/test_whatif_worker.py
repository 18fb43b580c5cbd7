"""A real worker on Redis runs what `POST /api/v1/engines/{id}/whatif` queued: the store is
PostgreSQL holding a real ledger engine's recorded requests, the worker a `junction worker`
process, and `GET /api/v1/whatif/{id}` shows the run go to done with its report: the report
`junction whatif` gives for the engine's own events (the store's hashes are salted, their
equalities the same)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from api.store.db import make_engine, make_sessionmaker
from cli.main import main
from engine.engine import Engine
from tests.api import factories
from tests.api.conftest import AUTH, TOKEN, Postgres
from tests.jobs.processes import WorkerProcess
from tests.uvicorn_thread import uvicorn_thread
from whatif.recording import from_events
from whatif.run import run_whatif
from whatif.settings import parse_settings

ENGINE = "whatif-redis"
SETTINGS = [
    {"label": "as vLLM would", "mode": "vllm"},
    {"eviction": "lru"},
    {"label": "memory ×2", "num_blocks": 176, "num_mamba_blocks": 24},
]


@pytest.fixture
def redis_whatif(
    postgres: Postgres, postgres_template: str, redis_server: str, tmp_path: Path
) -> Iterator[tuple[TestClient, WorkerProcess, Engine, str]]:
    """The app (in process, and served at the URL yielded) and a `junction worker` on a fresh
    PostgreSQL store that holds the engine's recorded requests, and an empty Redis database."""
    name = postgres.create("junction_whatif", template=postgres_template)
    url = postgres.url(name)
    db = make_engine(url)
    with make_sessionmaker(db)() as session:
        factories.ingest(session, engine := factories.run_engine(engine_id=ENGINE))
    db.dispose()
    broker = redis.Redis.from_url(redis_server)
    broker.flushdb()
    env = {
        "JUNCTION_DATABASE_URL": url,
        "JUNCTION_BROKER_URL": redis_server,
        "JUNCTION_RESULT_BACKEND": redis_server,
    }
    worker = WorkerProcess(env, tmp_path / "worker.log")
    settings = Settings(
        _env_file=None,
        database_url=url,
        api_token=TOKEN,
        broker_url=redis_server,
        result_backend=redis_server,
    )
    worker.start()
    try:
        worker.wait_ready()
        with (
            TestClient(create_app(settings), headers=AUTH) as client,
            uvicorn_thread(create_app(settings)) as api_url,
        ):
            yield client, worker, engine, api_url
    finally:
        worker.stop()
        broker.flushdb()
        broker.close()
        postgres.drop(name)


def test_a_redis_worker_runs_a_posted_whatif_to_done(redis_whatif) -> None:
    client, worker, engine, _ = redis_whatif
    posted = client.post(f"/api/v1/engines/{ENGINE}/whatif", json={"settings": SETTINGS})
    assert posted.status_code == 202, posted.text
    run_id, seen = posted.json()["id"], set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        run = client.get(f"/api/v1/whatif/{run_id}").json()
        seen.add(run["status"])
        if run["status"] in ("done", "failed"):
            break
        assert worker.process.poll() is None, f"the worker died:\n{worker.log()}"
        time.sleep(0.2)
    assert run["status"] == "done", (run["error"], worker.log()[-3000:])
    assert seen <= {"queued", "running", "done"}
    assert run["worker"] == worker.name and run["attempts"] == 1
    assert run["progress_done"] == run["progress_total"] == 8 * (1 + len(SETTINGS))
    report = run["result"]
    assert report["num_requests"] == 8 and report["recorded_tokens"] == sum(
        e.num_cached_tokens for e in engine.sink.events if e.type == "RequestFinished"
    )
    # the store's salted recording replays exactly as the engine's own events do
    direct = run_whatif(
        from_events(engine.cache_geometry(), engine.sink.events), parse_settings(SETTINGS)
    )
    assert report == direct.as_dict()
    assert report["exact"] and report["agreement"] == 8  # and gives back every recorded hit
    assert {r["label"] for r in report["results"]} == {"as vLLM would", "lru", "memory ×2"}
    gains = [r["gain_tokens"] for r in report["results"]]
    assert gains == sorted(gains, reverse=True)
    for result in report["results"]:
        assert result["gain_tokens"] == result["hit_tokens"] - report["as_ran"]["hit_tokens"]
        assert result["hit_tokens"] <= result["oracle_tokens"]
    listed = client.get(f"/api/v1/engines/{ENGINE}/whatif").json()
    assert [r["id"] for r in listed["runs"]] == [run_id]


def test_junction_whatif_engine_queues_follows_and_prints_the_run(redis_whatif, tmp_path, capsys):
    _, worker, engine, api_url = redis_whatif
    out = tmp_path / "report.json"
    args = ["whatif", "--engine", ENGINE, "--control-plane", api_url, "--token", TOKEN]
    assert main([*args, "--try", "eviction=lru", "--quiet", "--json", str(out)]) == 0, worker.log()
    printed = " ".join(capsys.readouterr().out.split())
    assert "reproduce 8 of 8 requests' hits (exact)" in printed and "│ lru │" in printed
    report = json.loads(out.read_text())
    direct = run_whatif(
        from_events(engine.cache_geometry(), engine.sink.events),
        parse_settings([{"eviction": "lru"}]),
    )
    assert report == direct.as_dict()
    # what the control plane refuses is said, exit 2
    assert main([*args, "--try", "num_blocks=4", "--quiet"]) == 2
    assert "needs 79 attention blocks, but num_blocks is 4" in capsys.readouterr().err
