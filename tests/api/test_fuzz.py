"""A property-based fuzz of the REST API from its own OpenAPI schema (schemathesis): for every
operation, generated requests (valid and invalid, with the bearer token and without) never get
a 5xx.

The store is a SQLite and a PostgreSQL database in turn (PostgreSQL refuses more than SQLite:
NUL characters, lone surrogates, integers beyond 64 bits), filled with a real ledger engine's
events, so reads find engines, blocks, requests and pins to page through, and writes have
something to change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from engine.engine import Engine
from tests.api import factories
from tests.api.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(params=["no token"])
def headers(request: pytest.FixtureRequest) -> dict[str, str]:
    """What every fuzzed request sends: nothing. With the bearer token, the contract test
    (`test_openapi_contract.py`) runs every schemathesis check, "no 5xx" among them."""
    return {}


@pytest.fixture
def fuzzed_api(tmp_path: Path, database_url: str, engine_run: Engine, headers: dict[str, str]):
    """The schema of the app over each backend, for each of `headers` (requested here so that
    pytest parametrizes the test by it: schemathesis asks for its fixtures lazily)."""
    app = factories.filled_app(tmp_path, database_url, engine_run, TOKEN)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("fuzzed_api")


@schema.parametrize()
@hypothesis_settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_5xx(case, headers: dict[str, str]) -> None:
    response = case.call(headers=headers)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} {case.query or ''} {case.body!r} -> "
        f"{response.status_code}: {response.text[:500]}"
    )
