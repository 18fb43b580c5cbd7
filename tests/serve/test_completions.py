"""`/v1/completions` through the official OpenAI client."""

from __future__ import annotations

import json

from tests.serve.conftest import MODEL, text_prompt


def test_a_completion_has_text_a_finish_reason_and_usage(client):
    completion = client.completions.create(
        model=MODEL, prompt="Hello, hybrid world", max_tokens=7, temperature=0
    )
    assert completion.object == "text_completion" and completion.model == MODEL
    (choice,) = completion.choices
    assert choice.finish_reason == "length" and isinstance(choice.text, str)
    usage = completion.usage
    assert usage.prompt_tokens == len(b"Hello, hybrid world")
    assert usage.completion_tokens == 7 and usage.total_tokens == usage.prompt_tokens + 7
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_max_tokens_defaults_to_16(client):
    assert client.completions.create(model=MODEL, prompt="abc").usage.completion_tokens == 16


def test_a_token_id_prompt_equals_its_text(client):
    text = client.completions.create(model=MODEL, prompt="same prompt", temperature=0)
    ids = client.completions.create(model=MODEL, prompt=list(b"same prompt"), temperature=0)
    batch_of_one = client.completions.create(model=MODEL, prompt=["same prompt"], temperature=0)
    assert text.choices[0].text == ids.choices[0].text == batch_of_one.choices[0].text


def test_streamed_text_equals_the_whole_text(client):
    prompt = text_prompt(101, 200)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stream=True
        )
    )
    assert len(chunks) > 2
    assert all(c.id == chunks[0].id and c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_a_stream_can_end_with_usage(client):
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="usage please",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_a_repeated_prompt_reports_cached_tokens(client):
    prompt = text_prompt(102)  # 600 tokens: many 16-token blocks and 64-token checkpoints
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < 600 and cached % 16 == 0
    assert second.choices[0].text == first.choices[0].text


def test_a_stop_string_cuts_the_text(client):
    prompt = text_prompt(103, 100)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0)
    text = whole.choices[0].text
    stop = text[5:7]
    cut = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.prompt_tokens_details.cached_tokens > 0  # the prompt ran just before
    streamed = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_the_wire_format_is_server_sent_events(live_server):
    body = {"model": MODEL, "prompt": "sse", "max_tokens": 3, "stream": True}
    with live_server.http() as http:
        response = http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][len("data: ") :])["object"] == "text_completion"
