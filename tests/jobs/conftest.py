"""Real services for the jobs: a Redis database of its own (flushed before and after), the
store fixtures of `tests/api`, `junction api` and `junction worker` subprocesses.

Redis from `JUNCTION_TEST_REDIS_URL` (default the local server, database 13); skipped if
unreachable, except under CI, where it fails (as PostgreSQL does in `tests/api/conftest.py`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from api.settings import Settings
from stack.parts import WORKER_CONCURRENCY
from tests.api.conftest import (  # noqa: F401 (fixtures, shared with tests/api)
    TOKEN,
    Postgres,
    database_url,
    postgres,
    postgres_template,
    sqlite_template,
)
from tests.api.processes import ApiProcess, free_port
from tests.jobs.processes import WorkerProcess

REDIS_URL = os.environ.get("JUNCTION_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


@pytest.fixture(scope="session")
def redis_server() -> str:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI"):  # CI must run the jobs on a real broker, never skip them
            pytest.fail(f"Redis not reachable at {REDIS_URL}: {exc}")
        pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:  # noqa: F811
    """The store of `database_url`; the embedded default broker, in the test's directory."""
    return Settings(
        _env_file=None,
        database_url=database_url,
        api_token=TOKEN,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        result_backend=f"db+sqlite:///{tmp_path / 'results.db'}",
    )


@pytest.fixture(scope="module")
def redis_stack(
    postgres: Postgres,  # noqa: F811
    postgres_template: str,  # noqa: F811
    redis_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ApiProcess, WorkerProcess]]:
    """`junction api` and a `junction worker` (prefork, as many processes as `junction up`
    starts) on a fresh PostgreSQL store and an empty Redis database, shared by a module's tests
    (they start in seconds)."""
    name = postgres.create("junction_jobs", template=postgres_template)
    client = redis.Redis.from_url(redis_server)
    client.flushdb()
    env = {
        "JUNCTION_DATABASE_URL": postgres.url(name),
        "JUNCTION_BROKER_URL": redis_server,
        "JUNCTION_RESULT_BACKEND": redis_server,
    }
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = WorkerProcess(env, log, pool="prefork", concurrency=WORKER_CONCURRENCY)
    api = ApiProcess(postgres.url(name), free_port())
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)  # ApiProcess passes on this process's environment
        worker.start()
        try:
            api.start()
            worker.wait_ready()
            yield api, worker
        finally:
            api.kill()
            worker.stop()
            client.flushdb()
            client.close()
            postgres.drop(name)
