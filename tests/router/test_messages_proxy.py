"""The router's `POST /v1/messages` against engines whose HTTP side the test scripts
(`httpx.MockTransport`, as `test_proxy.py`): Anthropic's stream relayed event for event with
its hit recorded, a stream broken mid-way ended by an Anthropic `error` event, and the errors
the router makes itself (a bad body, breakpoints, a prompt too long, no engine) in Anthropic's
shape, none of them sent to an engine."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.router.test_proxy import MODEL, URLS, BrokenBody, decisions, router, up_engine

ENGINE_EVENTS = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 3,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 32,
                "output_tokens": 0,
            },
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
    {"type": "message_stop"},
]


def message(text: str = "hello", **fields) -> dict:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": text}],
        **fields,
    }


def named_events(text: str) -> list[tuple[str, dict]]:
    """An Anthropic stream's events: each `event:` name with its data."""
    found = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        found.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return found


def test_a_stream_is_relayed_event_for_event_and_its_hit_recorded() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        text = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in ENGINE_EVENTS)
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    with router([up_engine(URLS[0])], handler) as client:
        response = client.post("/v1/messages", json=message(stream=True))
        (decision,) = decisions(client)
    assert response.status_code == 200
    assert named_events(response.text) == [(e["type"], e) for e in ENGINE_EVENTS]
    assert "stream_options" not in seen[0]  # the body goes as the client sent it
    assert seen[0]["messages"] == message()["messages"]
    assert (decision["status"], decision["engine_request_id"]) == ("finished", "msg_1")
    assert decision["realised_hit"] == 32


def test_a_stream_broken_mid_way_ends_in_an_anthropic_error_event() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=BrokenBody())

    with router([up_engine(URLS[0])], handler) as client:
        response = client.post("/v1/messages", json=message(stream=True))
        (decision,) = decisions(client)
    ((name, data),) = named_events(response.text)
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "api_error"
    assert "failed mid-stream" in data["error"]["message"]
    assert decision["status"] == "failed"


def marked(num_blocks: int, text: str = "x" * 40) -> list[dict]:
    block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    return [{"role": "user", "content": [block] * num_blocks}]


@pytest.mark.parametrize(
    ("body", "status", "kind", "starts"),
    [
        ({"model": MODEL, "messages": []}, 400, "invalid_request_error", "max_tokens: Field"),
        (message(model="other"), 404, "not_found_error", "model 'other' is not served"),
        (message(messages=marked(5)), 400, "invalid_request_error", "messages.0.content.4."),
        (message(messages=marked(1, "hi")), 400, "invalid_request_error", "messages.0.content.0"),
        (message("y" * 5000), 400, "invalid_request_error", "messages: the request holds at"),
        (message(prompt_cache_key="k" * 257), 400, "invalid_request_error", "prompt_cache_key"),
    ],
)
def test_what_the_router_refuses_is_in_anthropics_shape(body, status, kind, starts) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(500)

    with router([up_engine(URLS[0], max_request_tokens=1000)], handler) as client:
        response = client.post("/v1/messages", json=body)
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["type"] == "error" and answer["error"]["type"] == kind
    assert answer["error"]["message"].startswith(starts), answer
    assert calls == []


def test_no_engine_up_is_a_503_in_anthropics_shape() -> None:
    engine = up_engine(URLS[0])
    with router([engine], lambda request: httpx.Response(500)) as client:
        engine.mark_down("test: its feed closed")
        response = client.post("/v1/messages", json=message())
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "api_error"
    assert "no engine serving 'm' is up" in response.json()["error"]["message"]
