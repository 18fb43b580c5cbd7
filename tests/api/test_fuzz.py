"""A property-based fuzz of the REST API from its own OpenAPI schema (schemathesis): for every
operation, generated requests (valid and invalid, with the bearer token) never get a 5xx.

The store is a SQLite database filled with a real ledger engine's events, so reads find
engines, blocks, requests and pins to page through, and writes have something to change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from api.db import make_engine, make_sessionmaker
from api.main import create_app
from api.settings import Settings
from engine.engine import Engine
from tests.api import factories
from tests.api.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fuzzed_api(tmp_path: Path, sqlite_template: Path, engine_run: Engine):
    path = tmp_path / "junction.db"
    shutil.copyfile(sqlite_template, path)
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{path}",
        api_token=TOKEN,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        result_backend=f"db+sqlite:///{tmp_path / 'results.db'}",
    )
    db = make_engine(settings.database_url)
    with make_sessionmaker(db)() as session:
        factories.ingest(session, engine_run)
    db.dispose()
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(settings))


schema = schemathesis.pytest.from_fixture("fuzzed_api")


@schema.parametrize()
@hypothesis_settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_5xx(case) -> None:
    response = case.call(headers=AUTH)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} {case.query or ''} {case.body!r} -> "
        f"{response.status_code}: {response.text[:500]}"
    )
