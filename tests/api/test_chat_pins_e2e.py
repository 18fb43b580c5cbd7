"""Pins of chat messages: a system prompt pinned as each engine's chat template renders it.

1. `junction pin --system TEXT` sends the messages to the engine, which renders them itself;
   the control plane counts the same rendering for `num_tokens` and each boundary.
2. End to end over real processes (`junction api` on PostgreSQL, `junction serve --runner
   ledger` streaming to it, the official `openai` client): a system prompt pinned through REST
   is hit by the very first chat request that starts with it, up to the pinned boundary.
"""

from __future__ import annotations

import httpx
import pytest

from engine.model.tokenizer import ByteTokenizer, render_messages
from tests.api.conftest import TOKEN
from tests.api.processes import TOKEN as E2E_TOKEN
from tests.api.processes import Serve, pin_state
from tests.api.test_pins_cli import SocketEngine, run
from tests.polling import wait_for

SYSTEM = ("You are the Junction chat assistant. Answer in one short sentence. " * 9)[:560]
MESSAGES = [{"role": "system", "content": SYSTEM}]
RENDERED = ByteTokenizer().encode(render_messages(MESSAGES))  # 572 tokens
UNIT = 16


def test_pin_system_sends_messages_the_engine_renders(server: str, capsys, monkeypatch):
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", server)
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    engine = SocketEngine(server, "chat-pin")
    try:
        code, out, err = run(capsys, "pin", "--system", SYSTEM, "--label", "chat system")
        assert (code, err) == (0, "")
        boundary = len(RENDERED) // UNIT * UNIT
        assert f": {len(RENDERED)} tokens, boundary chat-pin {boundary}; pending" in out
        command = engine.answer()
        assert command["payload"]["messages"] == MESSAGES
        pin = engine.engine.pins[command["payload"]["pin_id"]]
        assert pin.boundary == boundary and pin.is_active
    finally:
        engine.ws.close()


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ({"messages": []}, "at least 1 item"),
        ({"messages": MESSAGES, "text": "x"}, "exactly one form"),
        ({"messages": [{"role": "system"}]}, "Field required"),
        ({"messages": [{"role": "", "content": "x"}]}, "at least 1 character"),
    ],
)
def test_bad_message_prefixes_are_422(client, prefix, message):
    response = client.post(
        "/api/v1/pins",
        json={"prefix": prefix, "label": "bad"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 422 and message in response.text


def test_a_pinned_chat_system_prompt_is_hit_by_the_first_chat_request(api_process):
    api = api_process
    serve = Serve(api, "e2e-chat-pin", runner="ledger")
    try:
        created = httpx.post(
            f"{api.url}/api/v1/pins",
            headers={"Authorization": f"Bearer {E2E_TOKEN}"},
            timeout=10,
            json={"prefix": {"messages": MESSAGES}, "label": "chat system prompt"},
        )
        assert created.status_code == 201, created.text
        pin = created.json()
        boundary = len(RENDERED) // UNIT * UNIT
        assert (pin["num_tokens"], pin["boundary"]) == (len(RENDERED), {"e2e-chat-pin": boundary})
        wait_for(
            "the pin to materialize",
            lambda: pin_state(api, pin["pin_id"], "e2e-chat-pin") == "materialized",
        )
        hits = []
        for question in ("What is a Mamba layer?", "What is attention?"):
            done = serve.client.chat.completions.create(
                model="junction-hybrid-tiny",
                messages=[*MESSAGES, {"role": "user", "content": question}],
                max_tokens=1,
            )
            hits.append(done.usage.prompt_tokens_details.cached_tokens)
        # the second also shares the user header and "What is " with the first: its interval
        # state at 576 lies past the pin
        assert hits[0] == boundary == 560 and hits[1] == 576
    finally:
        serve.stop()
