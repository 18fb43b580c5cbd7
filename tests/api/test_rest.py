"""The REST API over a store filled by the ingest functions with a ledger engine's events."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.main import create_app
from engine.engine import Engine
from engine.wire import encode
from tests.api import factories
from tests.api.conftest import AUTH, TOKEN
from tests.polling import wait_until

V1 = "/api/v1"


@pytest.fixture
def ingested(session: Session, engine_run: Engine) -> list[dict]:
    return factories.ingest(session, engine_run)


@pytest.fixture
def base(engine_run: Engine) -> str:
    return f"{V1}/engines/{engine_run.engine_id}"


def error(response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["detail"])


def test_engines(client: TestClient, engine_run: Engine, ingested, base: str) -> None:
    (engine,) = client.get(f"{V1}/engines").json()
    assert engine["engine_id"] == engine_run.engine_id
    assert (engine["epoch"], engine["next_seq"]) == (engine_run.epoch, len(ingested))
    assert engine["connected"] is True  # its hello was applied, no socket closed it
    assert engine["geometry"]["prefix_match_unit"] == 16
    detail = client.get(base).json()
    assert detail["num_requests"] == engine_run.stats.num_requests > 0
    for group, usage in engine_run.cache_usage().items():
        assert detail["cache"][group] == {
            "num_blocks": usage.num_blocks,
            "num_free": usage.num_free,
            "num_cached": usage.num_cached,
            "num_in_use": usage.num_in_use,
            "num_pinned": usage.num_pinned,
            "usage": pytest.approx(usage.usage),
        }


@pytest.mark.parametrize(
    "path", ["", "/blocks", "/requests", "/requests/req-0", "/hit-rate", "/attribution"], ids=str
)
def test_unknown_engine_is_a_404(client: TestClient, path: str) -> None:
    assert error(client.get(f"{V1}/engines/ghost{path}"), 404) == "engine 'ghost' not found"


def test_blocks_filters_and_pages(client: TestClient, engine_run: Engine, ingested, base) -> None:
    page = client.get(f"{base}/blocks", params={"limit": 10_000}).json()
    rows = page["blocks"]
    assert page["total"] == len(rows) > 0
    assert [(r["group"], r["block_id"]) for r in rows] == sorted(
        (r["group"], r["block_id"]) for r in rows
    )
    factories.assert_same_table(factories.table(rows), engine_run)
    mamba = client.get(f"{base}/blocks", params={"group": "mamba"}).json()
    assert mamba["blocks"] == [r for r in rows if r["group"] == "mamba"]
    pinned = client.get(f"{base}/blocks", params={"state": "pinned"}).json()
    assert pinned["total"] == sum(u.num_pinned for u in engine_run.cache_usage().values()) > 0
    assert all(r["state"] == "pinned" and r["pinned"] for r in pinned["blocks"])
    both = client.get(f"{base}/blocks", params={"group": "attention", "state": "cached"}).json()
    assert both["blocks"] == [
        r for r in rows if r["group"] == "attention" and r["state"] == "cached"
    ]
    paged = []
    for offset in range(0, len(rows), 7):
        page = client.get(f"{base}/blocks", params={"offset": offset, "limit": 7}).json()
        assert (page["offset"], page["limit"], page["total"]) == (offset, 7, len(rows))
        paged += page["blocks"]
    assert paged == rows


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"limit": 10_001}, "limit"),
        ({"limit": 0}, "limit"),
        ({"offset": -1}, "offset"),
        ({"state": "haunted"}, "state"),
        ({"group": "ssm"}, "group"),
    ],
    ids=str,
)
def test_bad_block_params_are_422(client: TestClient, ingested, base, params, where) -> None:
    response = client.get(f"{base}/blocks", params=params)
    assert response.status_code == 422
    (problem,) = response.json()["detail"]
    assert problem["loc"] == ["query", where]
    assert problem["msg"]


def test_requests_newest_first(client: TestClient, events, ingested, base) -> None:
    finished = [e for e in events if e["type"] == "RequestFinished"]
    page = client.get(f"{base}/requests").json()
    assert page["total"] == len(finished)
    listed = page["requests"]
    assert [r["finished_ts"] for r in listed] == sorted(
        (e["finished_ts"] for e in finished), reverse=True
    )
    second = client.get(f"{base}/requests", params={"offset": 2, "limit": 3}).json()
    assert second["requests"] == listed[2:5]
    one = client.get(f"{base}/requests/req-3").json()
    event = next(e for e in finished if e["request_id"] == "req-3")
    # prompt tokens: only the suggested junctions'; unit hashes: never (the store salts them)
    left_out = ("type", "junction_token_ids", "unit_hashes")
    assert "unit_hashes" not in one and one["attribution"]["state"] == "attributed"
    assert {k: one[k] for k in event if k not in left_out} == {
        k: [list(c) for c in v] if k == "chunks" else v
        for k, v in event.items()
        if k not in left_out
    }
    assert error(client.get(f"{base}/requests/req-99"), 404) == (
        "request 'req-99' of engine 'engine-test' not found"
    )
    assert client.get(f"{base}/requests", params={"limit": 1001}).status_code == 422


def test_hit_rate(client: TestClient, events, ingested, base) -> None:
    finished = [e for e in events if e["type"] == "RequestFinished"]
    body = client.get(f"{base}/hit-rate").json()
    total = body["total"]
    prompt = sum(e["num_prompt_tokens"] for e in finished)
    cached = sum(e["num_cached_tokens"] for e in finished)
    attention = sum(e["hit_tokens_by_group"]["attention"] for e in finished)
    assert (total["num_requests"], total["prompt_tokens"], total["cached_tokens"]) == (
        len(finished),
        prompt,
        cached,
    )
    assert total["hit_rate"] == pytest.approx(cached / prompt)
    assert total["hit_rate_by_group"]["attention"] == pytest.approx(attention / prompt)
    assert sum(b["num_requests"] for b in body["buckets"]) == len(finished)
    first = body["buckets"][0]
    assert first["bucket_s"] == 60 and first["bucket_start"] % 60 == 0
    after = client.get(f"{base}/hit-rate", params={"since": first["bucket_start"] + 60}).json()
    assert after["buckets"] == body["buckets"][1:]
    before = client.get(f"{base}/hit-rate", params={"until": first["bucket_start"]}).json()
    assert before["buckets"] == [] and before["total"]["hit_rate"] == 0.0
    assert error(client.get(f"{base}/hit-rate", params={"since": 10, "until": 5}), 400) == (
        "since (10.0) is after until (5.0)"
    )
    assert client.get(f"{base}/hit-rate", params={"since": "yesterday"}).status_code == 422


def test_events_after_a_seq(client: TestClient, engine_run, events, ingested) -> None:
    params = {"engine_id": engine_run.engine_id, "limit": 3}
    seen, after = [], -1
    while True:
        page = client.get(f"{V1}/events", params=params | {"after_seq": after}).json()
        if not page["batches"]:
            break
        assert page["epoch"] == engine_run.epoch
        seen += page["batches"]
        after = page["next_after_seq"]
    assert [b["seq"] for b in seen] == list(range(len(ingested)))
    assert [e["type"] for b in seen for e in b["events"]] == [e["type"] for e in events]
    assert events[0]["type"] == "PinUpdated" and events[0]["unit_hashes"]
    assert "unit_hashes" not in seen[0]["events"][0]  # the store keeps none, serves none
    assert seen[0]["events"][0] == {k: v for k, v in events[0].items() if k != "unit_hashes"}
    everything = client.get(f"{V1}/events", params={"limit": 1000}).json()
    assert len(everything["batches"]) == len(ingested)
    other_epoch = client.get(f"{V1}/events", params={"engine_id": "engine-test", "epoch": 1})
    assert other_epoch.json()["batches"] == []
    assert error(client.get(f"{V1}/events", params={"engine_id": "ghost"}), 404) == (
        "engine 'ghost' not found"
    )
    assert error(client.get(f"{V1}/events", params={"epoch": 3}), 400) == (
        "epoch needs an engine_id"
    )
    assert client.get(f"{V1}/events", params={"after_seq": -2}).status_code == 422


def test_prompt_tokens_are_returned_only_by_the_suggested_junctions(
    client: TestClient, engine_run, events, ingested, base
) -> None:
    sent = [e for e in events if e["type"] == "RequestFinished" and e["junction_token_ids"]]
    assert sent, "the run must leave a request whose match had no state (a junction)"
    requests = client.get(f"{base}/requests", params={"limit": 100}).json()["requests"]
    assert requests and all("junction_token_ids" not in r for r in requests)
    one = client.get(f"{base}/requests/{sent[0]['request_id']}").json()
    assert "junction_token_ids" not in one
    batches = client.get(f"{V1}/events", params={"limit": 1000}).json()["batches"]
    finished = [e for b in batches for e in b["events"] if e["type"] == "RequestFinished"]
    assert finished and all("junction_token_ids" not in e for e in finished)
    # where they are needed (to pin a suggested junction), they come, to a token holder
    suggested = client.get(f"{V1}/junctions/suggested").json()["junctions"]
    assert any(j["pin_request"]["prefix"]["token_ids"] for j in suggested)


def test_health_and_metrics(client: TestClient, settings) -> None:
    body = client.get("/healthz").json()
    assert body == {"status": "ok", "database": settings.database_url.split("+")[0].split(":")[0]}
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "junction_connected_engines" in metrics.text


def test_writes_need_the_token(
    client: TestClient, anonymous: TestClient, engine_run, ingested, base
) -> None:
    missing = anonymous.delete(base)
    assert error(missing, 401).startswith("missing bearer token")
    assert missing.headers["www-authenticate"] == "Bearer"
    assert error(client.delete(base, headers={"Authorization": "Bearer x"}), 401) == (
        "wrong bearer token"
    )
    with client.websocket_connect(
        f"{V1}/ingest", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as ws:
        ws.send_text(encode(factories.hello(engine_run)))
        ws.receive_json()
        connected = client.delete(base, headers={"Authorization": f"Bearer {TOKEN}"})
        assert error(connected, 409) == "engine 'engine-test' is connected; stop it first"
    registry = client.app.state.junction.registry
    assert wait_until(lambda: engine_run.engine_id not in registry)
    deleted = client.delete(base, headers={"Authorization": f"Bearer {TOKEN}"})
    assert deleted.status_code == 204
    assert client.get(base).status_code == 404
    assert client.get(f"{V1}/events").json()["batches"] == []
    assert client.get(f"{V1}/engines").json() == []


def test_openapi_lists_every_route(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths) == {
        "/api/v1/engines",
        "/api/v1/engines/{engine_id}",
        "/api/v1/engines/{engine_id}/blocks",
        "/api/v1/engines/{engine_id}/blocks/grid",
        "/api/v1/engines/{engine_id}/blocks/tiers",
        "/api/v1/engines/{engine_id}/requests",
        "/api/v1/engines/{engine_id}/requests/{request_id}",
        "/api/v1/engines/{engine_id}/dead-letters",
        "/api/v1/engines/{engine_id}/hit-rate",
        "/api/v1/engines/{engine_id}/attribution",
        "/api/v1/engines/{engine_id}/peer-blocks",
        "/api/v1/engines/{engine_id}/peer-summary",
        "/api/v1/engines/{engine_id}/peer-tree",
        "/api/v1/engines/{engine_id}/suggested-junctions",
        "/api/v1/engines/{engine_id}/whatif",
        "/api/v1/whatif/{run_id}",
        "/api/v1/events",
        "/api/v1/pins",
        "/api/v1/pins/{pin_id}",
        "/api/v1/junctions/suggested",
        "/api/v1/benchmarks",
        "/api/v1/benchmarks/suite",
        "/api/v1/benchmarks/{run_id}",
        "/api/v1/replicas",
        "/healthz",
        "/metrics",
    }
    assert set(paths["/api/v1/engines/{engine_id}"]) == {"get", "delete"}
    assert paths["/api/v1/engines/{engine_id}"]["delete"]["security"] == [{"HTTPBearer": []}]
    assert set(paths["/api/v1/pins/{pin_id}"]) == {"get", "delete"}
    assert paths["/api/v1/pins"]["post"]["security"] == [{"HTTPBearer": []}]
    assert paths["/api/v1/benchmarks"]["post"]["security"] == [{"HTTPBearer": []}]
    whatif = paths["/api/v1/engines/{engine_id}/whatif"]
    assert set(whatif) == {"get", "post"} and whatif["post"]["security"] == [{"HTTPBearer": []}]
    codes = {"202", "401", "403", "404", "408", "409", "413", "422", "429", "503"}
    assert set(whatif["post"]["responses"]) == codes


def test_a_starting_app_forgets_old_connections(settings, engine_run, ingested) -> None:
    """The hello left the engine marked connected, as a server that died would."""
    with TestClient(create_app(settings), headers=AUTH) as fresh:
        (engine,) = fresh.get(f"{V1}/engines").json()
    assert engine["connected"] is False
