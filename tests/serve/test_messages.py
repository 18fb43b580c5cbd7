"""Anthropic's Messages API on the engine, through Anthropic's own Python SDK: breakpoints
become checkpoints (a second request reads the prefix up to its breakpoint, on the match-unit
grid), usage splits the prompt as Anthropic does, streaming and not agree, and bad requests
are 400s in Anthropic's shape naming the field (issue 51)."""

from __future__ import annotations

import anthropic
import pytest

from engine.model.tokenizer import render_message
from tests.polling import wait_until
from tests.serve.conftest import MODEL, LiveServer, text_prompt

UNIT = 16  # the live server's match unit; its Mamba blocks are 64 tokens
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def claude(live_server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server.base_url, api_key="x", max_retries=0)


def turn(shared: str, rest: str, cache_control: dict | None = EPHEMERAL) -> list[dict]:
    """A user turn of two blocks, the first (shared by the family) marked as a breakpoint."""
    first = {"type": "text", "text": shared}
    if cache_control is not None:
        first["cache_control"] = cache_control
    return [{"role": "user", "content": [first, {"type": "text", "text": rest}]}]


def total(usage) -> int:
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def test_a_second_request_reads_up_to_the_breakpoint_inside_a_message(claude):
    shared = text_prompt(601, 300)
    breakpoint_at = len(render_message({"role": "user", "content": ""})) - 1 + len(shared)
    first = claude.messages.create(
        model=MODEL, max_tokens=2, messages=turn(shared, text_prompt(602, 100))
    )
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens == breakpoint_at // UNIT * UNIT
    second = claude.messages.create(
        model=MODEL, max_tokens=2, messages=turn(shared, "!" + text_prompt(603, 99))
    )
    # the block's end, not a message's: without the breakpoint the hit stops at the Mamba
    # block below it (256)
    assert breakpoint_at % 64 and breakpoint_at // UNIT * UNIT > 256
    assert second.usage.cache_read_input_tokens == breakpoint_at // UNIT * UNIT
    assert second.usage.cache_creation_input_tokens == 0
    assert total(second.usage) == total(first.usage)


def test_without_a_breakpoint_the_hit_stops_at_the_block_below(claude):
    shared = text_prompt(604, 300)
    plain = turn(shared, text_prompt(605, 100), cache_control=None)
    claude.messages.create(model=MODEL, max_tokens=1, messages=plain)
    again = turn(shared, "!" + text_prompt(606, 99), cache_control=None)
    second = claude.messages.create(model=MODEL, max_tokens=1, messages=again)
    assert second.usage.cache_read_input_tokens == 256
    assert second.usage.cache_creation_input_tokens == 0


def test_a_streamed_message_equals_the_whole_one(claude):
    system = [{"type": "text", "text": text_prompt(607, 200), "cache_control": EPHEMERAL}]
    messages = [{"role": "user", "content": text_prompt(608, 50)}]
    greedy = {"temperature": 0}  # not in this SDK's signature; Anthropic's API takes it
    whole = claude.messages.create(
        model=MODEL, max_tokens=8, system=system, messages=messages, extra_body=greedy
    )
    with claude.messages.stream(
        model=MODEL, max_tokens=8, system=system, messages=messages, extra_body=greedy
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == whole.content[0].text
    assert streamed.stop_reason == whole.stop_reason == "max_tokens"
    assert streamed.usage.output_tokens == whole.usage.output_tokens == 8
    assert total(streamed.usage) == total(whole.usage)
    assert streamed.usage.cache_read_input_tokens > 0  # the second read the system prompt


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"ttl": "2h"}, "messages.0.content.0.cache_control.ttl"),
        ({"short": True}, "messages.0.content.0.cache_control"),
        ({"breakpoints": 5}, "messages.0.content.4.cache_control"),
        ({"top_k": 5}, "top_k"),
    ],
)
def test_bad_requests_are_400s_in_anthropics_shape_naming_the_field(claude, change, field):
    blocks = [{"type": "text", "text": text_prompt(610 + i, 40)} for i in range(6)]
    marked = change.get("breakpoints", 1)
    for block in blocks[:marked]:
        block["cache_control"] = {"type": "ephemeral", "ttl": change.get("ttl", "5m")}
    if change.get("short"):
        blocks[0]["text"] = "hi"
    extra = {"extra_body": {"top_k": change["top_k"]}} if "top_k" in change else {}
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": blocks}], **extra
        )
    error = info.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(field)


def test_a_body_the_schema_refuses_and_an_unknown_model_answer_as_anthropic_does(
    claude, live_server
):
    with live_server.http() as http:  # the SDK itself refuses to send a body without max_tokens
        answer = http.post("/v1/messages", json={"model": MODEL, "messages": []})
    assert answer.status_code == 400
    assert answer.json()["type"] == "error"
    assert answer.json()["error"]["message"].startswith("max_tokens: Field required")
    with pytest.raises(anthropic.NotFoundError, match="not served here") as info:
        claude.messages.create(
            model="claude-none", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.body["error"]["type"] == "not_found_error"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_breakpoint_pins_its_prefix_for_its_ttl_renewed_by_hits(claude, live_server):
    engine = live_server.async_engine.engine
    clock = Clock(engine.clock())
    engine.clock, before = clock, engine.clock
    try:
        shared = text_prompt(620, 300)
        earlier = set(engine.pins)  # the module's server: other tests' leases
        claude.messages.create(model=MODEL, max_tokens=1, messages=turn(shared, "one"))
        leased = [pin for pin_id, pin in engine.pins.items() if pin_id not in earlier]
        assert [pin.pin_id[:4] for pin in leased] == ["ttl-"]
        assert wait_until(lambda: leased[0].state.value == "materialized", 10)
        clock.now += 200.0  # a hit renews the 5 minutes
        hit = claude.messages.create(model=MODEL, max_tokens=1, messages=turn(shared, "two"))
        assert hit.usage.cache_read_input_tokens == leased[0].boundary
        clock.now += 250.0
        claude.messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )
        assert leased[0].state.value == "materialized"
        clock.now += 60.0  # 310 s after the last hit: the next step releases it
        claude.messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "y"}]
        )
        assert leased[0].state.value == "released" and leased[0].pin_id not in engine.pins
    finally:
        engine.clock = before
