"""Auth by default: every route but `/healthz` and `/metrics` needs a bearer token, the
read-only token reads but cannot write, the token is checked before the path's resource is
looked up, and the ingest socket refuses a browser `Origin` it was not told to accept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from api.main import API_PREFIX, create_app
from api.settings import Settings
from engine.wire import encode
from tests.api import factories
from tests.api.conftest import AUTH, TOKEN

READ_TOKEN = "read-only-token-0123456789"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
INGEST = f"{API_PREFIX}/ingest"
# a value for each path parameter: none names a row, so only the token check can answer first
PATH_VALUES = {
    "engine_id": "ghost",
    "pin_id": "pin-ghost",
    "request_id": "req-ghost",
    "run_id": "1",
}


def rest_routes() -> list[tuple[str, str]]:
    """(method, path) of every HTTP route of the app (as its OpenAPI schema lists them), the
    path parameters filled in."""
    app = create_app(Settings(_env_file=None, database_url="sqlite://", api_token=TOKEN))
    return [
        (method.upper(), path.format(**PATH_VALUES))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    ]


ROUTES = rest_routes()
V1_ROUTES = [(method, path) for method, path in ROUTES if path.startswith(API_PREFIX)]
V1_READS = [path for method, path in V1_ROUTES if method == "GET"]
V1_WRITES = [(method, path) for method, path in V1_ROUTES if method != "GET"]


def test_the_routes_are_all_there() -> None:
    assert {path for _, path in ROUTES} - {path for _, path in V1_ROUTES} == {
        "/healthz",
        "/metrics",
    }
    assert len(V1_READS) >= 13 and len(V1_WRITES) == 5, V1_ROUTES


@pytest.mark.parametrize("path", V1_READS)
def test_a_read_without_a_token_is_401(anonymous: TestClient, path: str) -> None:
    response = anonymous.get(path)
    assert response.status_code == 401, response.text
    assert response.json()["detail"].startswith("missing bearer token")
    assert response.headers["www-authenticate"] == "Bearer"
    wrong = anonymous.get(path, headers={"Authorization": "Bearer not-the-token-at-all"})
    assert (wrong.status_code, wrong.json()["detail"]) == (401, "wrong bearer token")


@pytest.mark.parametrize(("method", "path"), V1_WRITES, ids=[" ".join(r) for r in V1_WRITES])
def test_a_write_without_a_token_is_401(anonymous: TestClient, method: str, path: str) -> None:
    response = anonymous.request(method, path, json={})
    assert response.status_code == 401, response.text


def test_health_and_metrics_need_no_token(anonymous: TestClient) -> None:
    assert anonymous.get("/healthz").status_code == 200
    assert anonymous.get("/metrics").status_code == 200


def test_an_openai_request_sent_here_is_told_where_the_engines_are(anonymous: TestClient):
    """A chat request to the control plane's port is a 404 that says this is not an engine and
    where engines serve (issue 47, item 18), not a 401 about a missing token."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
        answer = anonymous.request(method, path, json=body if method == "POST" else None)
        assert answer.status_code == 404
        message = answer.json()["error"]["message"]
        assert "control plane, not an engine" in message and ":8000/v1" in message


def test_the_token_is_checked_before_the_engine_is_looked_up(
    anonymous: TestClient, client: TestClient
) -> None:
    assert anonymous.delete(f"{API_PREFIX}/engines/unknown").status_code == 401
    assert anonymous.get(f"{API_PREFIX}/engines/unknown/blocks").status_code == 401
    assert client.delete(f"{API_PREFIX}/engines/unknown").status_code == 404  # with it: a 404


@pytest.fixture
def with_read_token(settings: Settings) -> Iterator[TestClient]:
    """The app with a read-only token too; the client sends no token of its own."""
    both = settings.model_copy(update={"read_token": READ_TOKEN})
    with TestClient(create_app(both)) as client:
        yield client


def test_the_read_token_reads_but_cannot_write(
    with_read_token: TestClient, session, engine_run
) -> None:
    client = with_read_token
    factories.ingest(session, engine_run)
    body = {"prefix": {"text": "You are a test. " * 8}, "label": "read me"}
    pin = client.post(f"{API_PREFIX}/pins", json=body, headers=AUTH).json()
    requests = client.get(f"{API_PREFIX}/engines/{engine_run.engine_id}/requests", headers=AUTH)
    found = {
        "engine_id": engine_run.engine_id,
        "pin_id": pin["pin_id"],
        "request_id": requests.json()["requests"][0]["request_id"],
    }
    ok = []
    for path in V1_READS:  # every read the write token makes, the read token makes alike
        for name, ghost in PATH_VALUES.items():
            path = path.replace(f"/{ghost}", f"/{found.get(name, ghost)}")
        as_reader = client.get(path, headers=READ)
        as_writer = client.get(path, headers=AUTH)
        assert as_reader.status_code == as_writer.status_code, (path, as_reader.text)
        if as_reader.status_code == 200:
            is_live = path.endswith(("/events", "/replicas"))  # heartbeats move between reads
            assert as_reader.json() == as_writer.json() or is_live, path
            ok.append(path)
    # every read of something that exists is a 200; only the runs never made are not
    assert len(ok) == len(V1_READS) - 2, ok
    assert not any(path.endswith(("/benchmarks/1", "/whatif/1")) for path in ok)
    (engine,) = client.get(f"{API_PREFIX}/engines", headers=READ).json()
    assert engine["engine_id"] == engine_run.engine_id
    pins = client.get(f"{API_PREFIX}/pins", headers=AUTH).json()  # the write token reads too
    refused = client.post(f"{API_PREFIX}/pins", json=body, headers=READ)
    assert refused.status_code == 403
    assert "read-only token (JUNCTION_READ_TOKEN) cannot write" in refused.json()["detail"]
    assert client.get(f"{API_PREFIX}/pins", headers=READ).json() == pins  # nothing was pinned
    gone = client.delete(f"{API_PREFIX}/engines/{engine_run.engine_id}", headers=READ)
    assert gone.status_code == 403
    assert client.delete(f"{API_PREFIX}/engines/unknown", headers=READ).status_code == 403
    assert client.post(f"{API_PREFIX}/benchmarks", json={}, headers=READ).status_code == 403
    whatif = f"{API_PREFIX}/engines/{engine_run.engine_id}/whatif"
    assert client.post(whatif, json={"settings": [{}]}, headers=READ).status_code == 403
    assert client.get(f"{API_PREFIX}/engines/{engine_run.engine_id}", headers=READ).is_success
    with client.websocket_connect(INGEST, headers=READ) as ws:  # nor stream events
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert (closed.value.code, closed.value.reason) == (4401, "wrong bearer token")


def ingest_hello(client: TestClient, engine_run, headers: dict) -> dict:
    """Open the socket with `headers`, say hello; the welcome."""
    with TestClient(client.app).websocket_connect(INGEST, headers=headers) as ws:
        ws.send_text(encode(factories.hello(engine_run)))
        return ws.receive_json()


def test_the_ingest_socket_refuses_a_foreign_origin(client: TestClient, engine_run) -> None:
    foreign = AUTH | {"Origin": "https://evil.example"}
    with TestClient(client.app).websocket_connect(INGEST, headers=foreign) as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 4403
    assert closed.value.reason == ("origin https://evil.example is not in JUNCTION_ALLOWED_ORIGINS")
    assert client.get(f"{API_PREFIX}/engines").json() == []  # its hello never came
    welcome = ingest_hello(client, engine_run, AUTH)  # an engine sends no Origin
    assert welcome["type"] == "welcome"


def test_an_allowed_origin_may_stream(settings: Settings, engine_run) -> None:
    allowed = settings.model_copy(update={"allowed_origins": ["https://ops.example"]})
    with TestClient(create_app(allowed)) as client:
        headers = AUTH | {"Origin": "https://OPS.example/"}
        assert ingest_hello(client, engine_run, headers)["type"] == "welcome"
        other = AUTH | {"Origin": "https://ops.example.evil"}
        with client.websocket_connect(INGEST, headers=other) as ws:
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_text()
        assert closed.value.code == 4403


def test_allowed_origins_read_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUNCTION_ALLOWED_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("JUNCTION_READ_TOKEN", "")
    settings = Settings(_env_file=None)
    assert settings.allowed_origins == ["https://a.example", "https://b.example"]
    assert settings.read_token is None and settings.api_token is None


@pytest.mark.parametrize("sent", [TOKEN[:-1], TOKEN[:8], TOKEN + "x", TOKEN.upper()])
def test_a_token_that_is_only_close_to_the_write_token_is_refused(
    anonymous: TestClient, engine_run, sent: str
) -> None:
    """A prefix, an extension or another case of the write token is another token: 401 on
    REST, 4401 on the ingest socket (a comparison up to the shorter length would let a prefix
    in)."""
    headers = {"Authorization": f"Bearer {sent}"}
    assert anonymous.get(f"{API_PREFIX}/engines", headers=headers).status_code == 401
    body = {"prefix": {"text": "You are a test. " * 8}, "label": "x"}
    assert anonymous.post(f"{API_PREFIX}/pins", json=body, headers=headers).status_code == 401
    with TestClient(anonymous.app).websocket_connect(INGEST, headers=dict(headers)) as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert (closed.value.code, closed.value.reason) == (4401, "wrong bearer token")
