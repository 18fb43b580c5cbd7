"""`GET /api/v1/benchmarks/suite`: the standard suite's specs, as a run stores its spec (each
one valid, defaults filled in), a read like the others: either token, never none."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.runs.specs import validate_spec
from api.settings import Settings
from bench import STANDARD_SUITE

URL = "/api/v1/benchmarks/suite"
READ_TOKEN = "read-token-0123456789"

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def test_the_suite_is_the_standard_suite_with_its_defaults(client: TestClient) -> None:
    response = client.get(URL)
    assert response.status_code == 200, response.text
    suite = response.json()
    assert [spec["name"] for spec in suite] == [spec.name for spec in STANDARD_SUITE]
    for spec in suite:
        assert validate_spec(spec) == spec  # as stored: nothing left to fill in
    assert client.get("/api/v1/benchmarks").json()["total"] == 0  # a read: nothing queued


def test_the_suite_needs_a_token_and_takes_the_read_one(settings: Settings, auth: dict) -> None:
    with TestClient(create_app(settings.model_copy(update={"read_token": READ_TOKEN}))) as app:
        assert app.get(URL).status_code == 401
        assert app.get(URL, headers={"Authorization": "Bearer nope"}).status_code == 401
        read = app.get(URL, headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert read.status_code == 200 and read.json() == app.get(URL, headers=auth).json()
