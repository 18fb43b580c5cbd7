"""The transport every REST client shares (`client.transport`), over real HTTP: the bearer
token and query sent, JSON back (None for nothing), and every failure an `ApiError` whose
message and `reason` say what went wrong, each client reading its own service's error body."""

from __future__ import annotations

import pytest

from client.rest import ApiClient
from client.router import RouterClient
from client.transport import ApiError, ApiUnreachable, JsonClient
from tests.api.processes import free_port
from tests.client.conftest import TOKEN


def test_a_call_sends_the_token_and_the_set_params(service: str) -> None:
    api = ApiClient(service + "/", TOKEN)
    assert api.base_url == service  # the trailing slash dropped
    answer = api.call("GET", "/echo", params={"limit": 5, "since": None})
    assert answer == {"authorization": f"Bearer {TOKEN}", "params": {"limit": "5"}}
    assert ApiClient(service).call("GET", "/echo")["authorization"] is None  # no token: none


def test_an_empty_answer_is_none(service: str) -> None:
    assert ApiClient(service, TOKEN).call("DELETE", "/empty") is None


def test_the_apis_detail_is_the_reason(service: str) -> None:
    with pytest.raises(ApiError) as caught:
        ApiClient(service, TOKEN).call("GET", "/taken")
    error = caught.value
    assert str(error) == "GET /taken: HTTP 409: pin 'p1' is taken"
    assert (error.method, error.path, error.status) == ("GET", "/taken", 409)
    assert error.url == f"{service}/api/v1/taken" and error.reason == "pin 'p1' is taken"
    assert not isinstance(error, ApiUnreachable)


def test_each_validation_error_is_named_by_its_field(service: str) -> None:
    with pytest.raises(ApiError) as caught:
        ApiClient(service, TOKEN).call("POST", "/specs", json={"name": "x", "concurrency": "8x"})
    assert caught.value.status == 422
    assert caught.value.reason.startswith("concurrency: Input should be a valid integer")


def test_the_routers_openai_error_is_the_reason(service: str) -> None:
    with pytest.raises(ApiError) as caught:
        RouterClient(service, TOKEN).decision("r-9")
    error = caught.value
    assert error.status == 404 and error.url == f"{service}/fleet/decisions/r-9"
    assert error.reason == "no decision 'r-9' among the last 1000"
    assert str(error) == f"GET /fleet/decisions/r-9: HTTP 404: {error.reason}"


def test_a_body_that_is_no_error_object_is_said_as_text(service: str) -> None:
    for client in (JsonClient(service), ApiClient(service), RouterClient(service)):
        client.prefix = ""  # `/text` sits at the root
        with pytest.raises(ApiError) as caught:
            client.call("GET", "/text")
        assert (caught.value.status, caught.value.reason) == (502, "upstream fell over")


@pytest.mark.parametrize(
    ("client", "service_name"),
    [(ApiClient, "the control plane"), (RouterClient, "the router")],
)
def test_nothing_answering_is_unreachable_naming_the_service(client, service_name) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ApiUnreachable) as caught:
        client(url, TOKEN, timeout_s=2).call("GET", "/fleet")
    error = caught.value
    assert str(error).startswith(f"cannot reach {service_name} at {url}: ")
    assert error.status is None and error.url == f"{url}{client.prefix}/fleet"


def test_a_slow_answer_is_unreachable_after_the_timeout(service: str) -> None:
    client = JsonClient(service, TOKEN, timeout_s=0.2)
    with pytest.raises(ApiUnreachable) as caught:
        client.call("GET", "/slow")
    assert caught.value.reason == "no answer in 0.2 s"
    assert str(caught.value) == f"cannot reach the service at {service}: no answer in 0.2 s"
