"""OpenAI's prompt caching fields on the engine (issue 51): `prompt_cache_retention: "24h"`
pins the prompt's prefix on the hit grid for 24 hours (streamed or not), `"in_memory"` leaves
it to the cache, anything else is a 400 naming the field; `prompt_cache_key` is accepted (a
routing hint for the router)."""

from __future__ import annotations

import openai
import pytest

from tests.polling import wait_until
from tests.serve.conftest import MODEL, LiveServer, text_prompt


def new_pins(live_server: LiveServer, earlier: set[str]) -> dict:
    engine = live_server.async_engine.engine
    return {pin_id: pin for pin_id, pin in engine.pins.items() if pin_id not in earlier}


def test_24h_retention_leases_the_prompt_for_a_day(client, live_server):
    engine = live_server.async_engine.engine
    earlier = set(engine.pins)
    prompt = text_prompt(701, 200)
    client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, extra_body={"prompt_cache_retention": "24h"}
    )
    (pin,) = new_pins(live_server, earlier).values()
    assert pin.pin_id.startswith("ttl-") and pin.boundary == 192
    assert wait_until(lambda: pin.state.value == "materialized", 10)
    ends_in = engine.leases.ends_at[pin.pin_id] - engine.clock()
    assert 24 * 3600 - 60 < ends_in <= 24 * 3600


def test_a_streamed_chat_with_24h_retention_leases_it_too(client, live_server):
    earlier = set(live_server.async_engine.engine.pins)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": text_prompt(702, 150)}],
        max_tokens=2,
        stream=True,
        extra_body={"prompt_cache_retention": "24h", "prompt_cache_key": "tenant-a"},
    )
    assert list(stream)
    assert wait_until(lambda: len(new_pins(live_server, earlier)) == 1, 10)


def test_in_memory_retention_pins_nothing(client, live_server):
    earlier = set(live_server.async_engine.engine.pins)
    client.completions.create(
        model=MODEL,
        prompt=text_prompt(703, 200),
        max_tokens=1,
        extra_body={"prompt_cache_retention": "in_memory", "prompt_cache_key": "k"},
    )
    assert new_pins(live_server, earlier) == {}


def test_an_unknown_retention_is_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError, match="in_memory, 24h") as info:
        client.completions.create(
            model=MODEL, prompt="hello", max_tokens=1, extra_body={"prompt_cache_retention": "1y"}
        )
    assert info.value.param == "prompt_cache_retention"


def test_a_cache_key_over_256_characters_is_refused_naming_the_field(client):
    """The router keeps keys in memory (`router.affinity`): the schema bounds them, as
    `cache_salt`, so the engine and the router refuse the same ones."""
    with pytest.raises(openai.UnprocessableEntityError, match="256") as info:
        client.completions.create(
            model=MODEL, prompt="hello", max_tokens=1, extra_body={"prompt_cache_key": "k" * 257}
        )
    assert info.value.param == "prompt_cache_key"


def test_usage_reports_the_tokens_written_beside_those_read(client):
    prompt = text_prompt(704, 400)
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
    details = first.prompt_tokens_details
    assert details.cached_tokens == 0 and details.cache_write_tokens == 400 // 16 * 16
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
    details = again.prompt_tokens_details
    assert details.cached_tokens > 0
    assert details.cached_tokens + details.cache_write_tokens <= 400
