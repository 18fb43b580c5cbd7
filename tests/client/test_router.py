"""The router's REST client (`client.router`) against a real `junction route` over a real
`junction serve --runner null` engine: the fleet, the decisions and one decision as the router
serves them; a decision it does not know and a wrong token as `ApiError`s in its own words."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgspec
import pytest

from client.router import RouterClient
from client.transport import ApiError
from tests.router.processes import AUTH, TOKEN, Process, running, start_engine, start_router


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    logs = tmp_path_factory.mktemp("router-client")
    with (
        running(start_engine(logs, "a")) as engines,
        running(start_router(logs, engines)) as (router,),
    ):
        yield router


def routed(router: Process) -> str:
    """Send one chat request through the router; the engine's completion id."""
    body = {"model": "junction-hybrid-tiny", "max_tokens": 2}
    body["messages"] = [{"role": "user", "content": "What is a junction?"}]
    response = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def test_the_fleet_and_its_decisions_as_the_router_serves_them(router: Process) -> None:
    client = RouterClient(router.url, TOKEN)
    fleet = client.fleet()
    served = httpx.get(f"{router.url}/fleet", headers=AUTH, timeout=10).json()
    assert msgspec.to_builtins(fleet).keys() == served.keys()  # every field the router serves
    assert fleet.policy == served["policy"]
    assert [(e.engine_id, e.url) for e in fleet.engines] == [
        (e["engine_id"], e["url"]) for e in served["engines"]
    ]
    assert [engine.engine_id for engine in fleet.engines] == ["a"]
    assert msgspec.to_builtins(fleet.engines[0]).keys() == served["engines"][0].keys()
    completion_id = routed(router)
    (decision,) = client.decisions(limit=1)
    assert decision.engine_request_id == completion_id
    assert client.decision(completion_id) == decision  # by the engine's id too
    assert client.decision(decision.request_id) == decision


def test_an_unknown_decision_is_a_404_in_the_routers_words(router: Process) -> None:
    with pytest.raises(ApiError) as caught:
        RouterClient(router.url, TOKEN).decision("no-such-request")
    assert caught.value.status == 404
    assert caught.value.reason.startswith("no decision 'no-such-request'")


def test_a_wrong_token_is_a_401_saying_what_to_send(router: Process) -> None:
    with pytest.raises(ApiError) as caught:
        RouterClient(router.url, "not-the-routers").fleet()
    assert caught.value.status == 401
    assert "send Authorization: Bearer" in caught.value.reason
    assert str(caught.value).startswith("GET /fleet: HTTP 401: ")
