"""`/healthz` stays off the readers' path (`api.store.health`, `api.routes.health`): it takes
none of the shared worker threads, and its database check runs once for many callers."""

from __future__ import annotations

import anyio
import anyio.to_thread
import httpx
import pytest
from sqlalchemy import create_engine

from api.main import create_app
from api.settings import Settings
from api.store.health import HealthCheck


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def asgi_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.anyio
async def test_healthz_answers_while_every_shared_worker_thread_is_taken(
    settings: Settings,
) -> None:
    """Heavy reads (or anything else) holding every worker thread of the pool the sync routes
    share: /healthz still answers 200 (it would wait for a thread, before)."""
    app = create_app(settings)
    shared = anyio.to_thread.current_default_thread_limiter()
    borrowers = [object() for _ in range(int(shared.total_tokens))]
    for borrower in borrowers:
        await shared.acquire_on_behalf_of(borrower)
    try:
        async with asgi_client(app) as http:
            with anyio.fail_after(30):
                answer = await http.get("/healthz")
    finally:
        for borrower in borrowers:
            shared.release_on_behalf_of(borrower)
    assert answer.status_code == 200 and answer.json()["status"] == "ok"


@pytest.mark.anyio
async def test_many_health_checks_at_once_make_one_database_query(settings: Settings) -> None:
    app = create_app(settings)
    check = app.state.junction.health = HealthCheck(max_age_s=3600)
    answers: list[int] = []
    async with asgi_client(app) as http:

        async def ask() -> None:
            answers.append((await http.get("/healthz")).status_code)

        async with anyio.create_task_group() as tasks:
            for _ in range(20):
                tasks.start_soon(ask)
    assert answers == [200] * 20
    assert check.num_checks == 1


@pytest.mark.anyio
async def test_a_database_out_of_reach_is_unhealthy(tmp_path) -> None:
    db = create_engine(f"sqlite:///{tmp_path}/missing/directory/store.db")
    health = await HealthCheck(max_age_s=0).check(db)
    assert (health.is_ok, health.database) == (False, "error: OperationalError")
