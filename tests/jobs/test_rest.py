"""`/api/v1/benchmarks` in process: queueing (onto a real SQLAlchemy-transport broker),
validation, the broker down, listing and showing runs."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.runs.broker import TASK_RUN
from api.settings import Settings
from tests.jobs.specs import tiny_spec

URL = "/api/v1/benchmarks"


@pytest.fixture
def client(settings: Settings, auth: dict) -> Iterator[TestClient]:
    """The app, every request with the write token (reads need a token too)."""
    with TestClient(create_app(settings), headers=auth) as client:
        yield client


@pytest.fixture
def anonymous(client: TestClient) -> TestClient:
    """The same app, every request without a token."""
    return TestClient(client.app)


def broker_messages(settings: Settings) -> list[dict]:
    path = settings.broker_url.removeprefix("sqla+sqlite:///")
    with sqlite3.connect(path) as db:
        payloads = [row[0] for row in db.execute("SELECT payload FROM kombu_message")]
    return [json.loads(payload) for payload in payloads]


def test_post_queues_a_run_and_its_message(
    client: TestClient, settings: Settings, auth: dict
) -> None:
    response = client.post(URL, json=tiny_spec(), headers=auth)
    assert response.status_code == 201, response.text
    run = response.json()
    assert run["status"] == "queued" and run["name"] == "tiny-gsp" and run["progress"] == 0
    assert run["attempts"] == 0 and run["results"] is None and run["error"] is None
    assert run["spec"]["geometry"]["max_num_batched_tokens"] == 8192  # defaults filled in
    [message] = broker_messages(settings)
    assert message["headers"]["task"] == TASK_RUN
    assert message["headers"]["id"] == run["task_id"]
    assert client.get(f"{URL}/{run['id']}").json() == run


def test_post_needs_the_token(client: TestClient, anonymous: TestClient) -> None:
    assert anonymous.post(URL, json=tiny_spec()).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert client.post(URL, json=tiny_spec(), headers=wrong).status_code == 401


def test_a_bad_spec_is_422_naming_the_field(client: TestClient, auth: dict) -> None:
    bad = tiny_spec(modes=["off", "warp"], concurrency=0)
    response = client.post(URL, json=bad, headers=auth)
    assert response.status_code == 422
    locs = {tuple(error["loc"]) for error in response.json()["detail"]}
    assert ("body", "modes", 1) in locs and ("body", "concurrency") in locs
    too_small = tiny_spec(geometry={"block_size": 16, "mamba_block_size": 64, "num_blocks": 4})
    detail = client.post(URL, json=too_small, headers=auth).json()["detail"]
    assert "raise geometry.num_blocks" in detail[0]["msg"]
    assert client.post(URL, content="[1, 2", headers=auth).status_code == 422
    assert client.get(URL).json()["total"] == 0


def test_an_unreachable_broker_is_503_and_queues_nothing(settings: Settings, auth: dict) -> None:
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down), headers=auth) as client:
        response = client.post(URL, json=tiny_spec(), headers=auth)
        assert response.status_code == 503
        detail = response.json()["detail"]
        assert "broker at redis://127.0.0.1:1/0 is unreachable" in detail
        assert detail.endswith("the run was not queued")
        assert client.get(URL).json() == {"total": 0, "offset": 0, "limit": 50, "runs": []}


def test_list_newest_first_by_status_and_pages(
    client: TestClient, settings: Settings, auth: dict, tmp_path: Path
) -> None:
    ids = [
        client.post(URL, json=tiny_spec(f"run-{i}"), headers=auth).json()["id"] for i in range(3)
    ]
    page = client.get(URL, params={"limit": 2}).json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 2, 0)
    assert [run["id"] for run in page["runs"]] == ids[::-1][:2]
    rest = client.get(URL, params={"limit": 2, "offset": 2}).json()
    assert [run["id"] for run in rest["runs"]] == [ids[0]]
    assert client.get(URL, params={"status": "queued"}).json()["total"] == 3
    assert client.get(URL, params={"status": "failed"}).json()["total"] == 0
    assert client.get(URL, params={"status": "lost"}).status_code == 422
    assert client.get(URL, params={"limit": 0}).status_code == 422


def test_an_unknown_run_is_404(client: TestClient) -> None:
    response = client.get(f"{URL}/12345")
    assert response.status_code == 404
    assert response.json()["detail"] == "benchmark run 12345 not found"
