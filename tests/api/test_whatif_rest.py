"""`/api/v1/engines/{engine_id}/whatif` and `/api/v1/whatif/{run_id}` in process, on both
backends: queueing onto a real SQLAlchemy-transport broker (202), the settings checked (422
naming the field), an unknown engine (404), an engine with nothing recorded (409), the token
(401, 403), the broker down (503), the runs' cap (429, the oldest finished pruned), paging."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.ingest.frames import apply_hello
from api.main import create_app
from api.runs.broker import TASK_WHATIF
from api.settings import Settings
from api.whatif import runs
from tests.api import factories
from tests.api.conftest import AUTH

V1 = "/api/v1"
READ_TOKEN = "read-only-token-0123456789"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The store's settings with a scratch broker (Celery's SQLAlchemy transport on SQLite)."""
    return settings.model_copy(
        update={
            "broker_url": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
            "result_backend": f"db+sqlite:///{tmp_path / 'results.db'}",
            "read_token": READ_TOKEN,
        }
    )


@pytest.fixture
def recorded(session, engine_run) -> str:
    """The engine's run ingested (its chains kept); its id."""
    factories.ingest(session, engine_run)
    return engine_run.engine_id


def url(engine_id: str) -> str:
    return f"{V1}/engines/{engine_id}/whatif"


def broker_messages(settings: Settings) -> list[dict]:
    path = settings.broker_url.removeprefix("sqla+sqlite:///")
    with sqlite3.connect(path) as db:
        payloads = [row[0] for row in db.execute("SELECT payload FROM kombu_message")]
    return [json.loads(payload) for payload in payloads]


def test_post_queues_a_run_and_its_message(client, settings, recorded, engine_run):
    body = {"settings": [{"mode": "vllm", "label": "as vLLM would"}, {"eviction": "lru"}, {}]}
    response = client.post(url(recorded), json=body)
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["status"] == "queued" and run["engine_id"] == recorded
    assert run["epoch"] == engine_run.epoch and run["result"] is None
    assert run["settings"] == body["settings"]
    assert (run["progress_done"], run["progress_total"], run["attempts"]) == (0, 0, 0)
    [message] = broker_messages(settings)
    assert message["headers"]["task"] == TASK_WHATIF
    assert client.get(f"{V1}/whatif/{run['id']}").json() == run
    page = client.get(url(recorded)).json()
    assert page == {"total": 1, "offset": 0, "limit": 50, "runs": [run]}


@pytest.mark.parametrize(
    ("settings_", "named"),
    [
        ([{"block_size": 0}], "what-if setting 0: block_size: Input should be greater than 0"),
        ([{}, {"warp": 1}], "what-if setting 1: warp: unknown field (fields: label, mode,"),
        ([{"eviction": "fifo"}], "what-if setting 0: eviction: Input should be"),
        ([{"prefix_match_unit": 8}], "prefix_match_unit 8 is not a multiple of the recording's"),
        (
            [{"num_blocks": 4}],
            "blocks 4': the longest request (648 tokens) needs 79 attention blocks, but",
        ),
    ],
)
def test_a_bad_setting_is_422_naming_the_field(client, recorded, settings_, named):
    response = client.post(url(recorded), json={"settings": settings_})
    assert response.status_code == 422, response.text
    assert named in response.json()["detail"]
    assert client.get(url(recorded)).json()["total"] == 0


def test_the_body_is_checked(client, recorded):
    too_many = {"settings": [{}] * 33}
    assert client.post(url(recorded), json=too_many).status_code == 422
    assert client.post(url(recorded), json={"settings": []}).status_code == 422
    assert client.post(url(recorded), json={"settings": [{}], "extra": 1}).status_code == 422
    assert client.post(url(recorded), content="[1, 2").status_code == 422
    assert client.post(url(recorded), json={"settings": [{}], "epoch": -1}).status_code == 422


def test_unknown_engines_and_runs_are_404(client):
    response = client.post(url("ghost"), json={"settings": [{}]})
    assert (response.status_code, response.json()["detail"]) == (404, "engine 'ghost' not found")
    assert client.get(url("ghost")).status_code == 404
    response = client.get(f"{V1}/whatif/12345")
    assert (response.status_code, response.json()["detail"]) == (
        404,
        "what-if run 12345 not found",
    )


def test_an_engine_with_nothing_recorded_is_409(client, session, recorded, engine_run):
    response = client.post(url(recorded), json={"settings": [{}], "epoch": 7})
    assert response.status_code == 409
    assert "has no recorded request chains in epoch 7" in response.json()["detail"]
    apply_hello(session, factories.parse(factories.hello(engine_run, epoch=engine_run.epoch + 1)))
    fresh = "fresh-engine"
    hello = factories.hello(engine_run) | {"engine_id": fresh}
    apply_hello(session, factories.parse(hello))
    response = client.post(url(fresh), json={"settings": [{}]})
    assert response.status_code == 409
    assert "has no recorded request chains" in response.json()["detail"]
    # the newest epoch with chains is the older one: a restart does not lose what ran
    again = client.post(url(recorded), json={"settings": [{}]})
    assert again.status_code == 202 and again.json()["epoch"] == engine_run.epoch


def test_writes_need_the_write_token(client, recorded):
    anonymous = TestClient(client.app)
    assert anonymous.post(url(recorded), json={"settings": [{}]}).status_code == 401
    assert anonymous.get(url(recorded)).status_code == 401
    assert anonymous.get(f"{V1}/whatif/1").status_code == 401
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    assert anonymous.post(url(recorded), json={"settings": [{}]}, headers=read).status_code == 403
    assert anonymous.get(url(recorded), headers=read).status_code == 200


def test_an_unreachable_broker_is_503_and_queues_nothing(settings, recorded):
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down), headers=AUTH) as client:
        response = client.post(url(recorded), json={"settings": [{}]})
        assert response.status_code == 503
        assert response.json()["detail"].endswith("the what-if was not queued")
        assert client.get(url(recorded)).json()["total"] == 0


@pytest.fixture
def capped(settings: Settings) -> Iterator[TestClient]:
    with TestClient(
        create_app(settings.model_copy(update={"whatif_max_runs": 2})), headers=AUTH
    ) as c:
        yield c


def test_the_runs_are_capped_the_oldest_finished_going_first(capped, session, recorded):
    first, second = (capped.post(url(recorded), json={"settings": [{}]}).json() for _ in "ab")
    refused = capped.post(url(recorded), json={"settings": [{}]})
    assert refused.status_code == 429
    assert "JUNCTION_WHATIF_MAX_RUNS" in refused.json()["detail"]
    runs.LIFE.fail(session, first["id"], "test: done with it")
    third = capped.post(url(recorded), json={"settings": [{}]})
    assert third.status_code == 202
    listed = [run["id"] for run in capped.get(url(recorded)).json()["runs"]]
    assert listed == [third.json()["id"], second["id"]]  # the failed one made room


def test_the_list_pages_newest_first_and_filters_by_status(client, session, recorded):
    ids = [client.post(url(recorded), json={"settings": [{}]}).json()["id"] for _ in range(3)]
    page = client.get(url(recorded), params={"limit": 2}).json()
    assert (page["total"], [r["id"] for r in page["runs"]]) == (3, ids[::-1][:2])
    rest = client.get(url(recorded), params={"limit": 2, "offset": 2}).json()
    assert [r["id"] for r in rest["runs"]] == [ids[0]]
    runs.LIFE.fail(session, ids[1], "test")
    failed = client.get(url(recorded), params={"status": "failed"}).json()
    assert [r["id"] for r in failed["runs"]] == [ids[1]]
    assert failed["runs"][0]["error"] == "test"
    assert client.get(url(recorded), params={"status": "lost"}).status_code == 422


def test_a_bridged_engine_is_409_saying_how_to_ask_it(client, session):
    """A bridged vLLM engine reports no match unit: its what-if goes through `junction attach
    --recording-out` and `junction whatif --recording`, and the answer says so."""
    from tests.api.test_peer_blocks import peer_hello

    apply_hello(session, factories.parse(peer_hello(engine_id="bridged")))
    response = client.post(url("bridged"), json={"settings": [{}]})
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert "does not report its match unit" in detail and "--recording-out" in detail


def test_a_run_over_the_memory_bound_is_refused_before_it_is_queued(client, recorded):
    """Issue 47, item 11: the largest settings the schema took (32 x 2^24 blocks) held a
    worker at 7.8 GB for about 50 minutes; now the schema stops at 2^22 blocks a pool, and a
    run whose estimate is over JUNCTION_WHATIF_MAX_BYTES (2 GiB) is 422 naming it."""
    huge = {"settings": [{"num_blocks": 1 << 24, "num_mamba_blocks": 1 << 24}] * 32}
    response = client.post(url(recorded), json=huge)
    assert response.status_code == 422, response.text
    assert "num_blocks: Input should be less than or equal to 4194304" in response.text
    largest = {"label": "big", "num_blocks": 1 << 22, "num_mamba_blocks": 1 << 22}
    response = client.post(url(recorded), json={"settings": [{}, largest]})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "would hold about 4.30 GB at once, over JUNCTION_WHATIF_MAX_BYTES (2.15 GB)" in detail
    assert "its largest setting, 'big', has 8,388,608 blocks and slots" in detail
    assert client.get(url(recorded)).json()["total"] == 0
    fits = {"label": "fits", "num_blocks": 1 << 20, "num_mamba_blocks": 1 << 16}
    assert client.post(url(recorded), json={"settings": [fits]}).status_code == 202


def test_a_run_over_the_time_bound_is_refused_before_it_is_queued(settings, recorded):
    brief = settings.model_copy(update={"whatif_max_seconds": 0.001})
    with TestClient(create_app(brief), headers=AUTH) as client:
        response = client.post(url(recorded), json={"settings": [{}, {"eviction": "lru"}]})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert "its 3 replays would take about" in detail
        assert "over JUNCTION_WHATIF_MAX_SECONDS (0.001 s)" in detail
        assert client.get(url(recorded)).json()["total"] == 0
