"""Many clients at once, and clients that hang up: the engine aborts what nobody waits for."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.polling import wait_until
from tests.serve.conftest import (
    MODEL,
    LiveServer,
    SlowRunner,
    serve,
    small_engine,
    text_prompt,
)


def test_eight_concurrent_requests_all_complete(live_server):
    client = live_server.client()

    def complete(i: int):
        if i % 2:
            messages = [{"role": "user", "content": text_prompt(400 + i, 300)}]
            return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
        return client.completions.create(model=MODEL, prompt=text_prompt(400 + i), max_tokens=12)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(complete, range(8)))
    assert [r.usage.completion_tokens for r in results] == [12] * 8
    assert all(r.choices[0].finish_reason == "length" for r in results)
    assert wait_until(lambda: live_server.async_engine.num_in_flight == 0)


@pytest.fixture(scope="module")
def slow_server() -> Iterator[LiveServer]:
    yield from serve(small_engine(SlowRunner()))


def finished_by(server: LiveServer, reason: str) -> float:
    with server.http() as http:
        text = http.get("/metrics").text
    line = f'junction_requests_finished_total{{reason="{reason}"}}'
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)


def test_a_stream_the_client_drops_is_aborted(slow_server):
    body = {"model": MODEL, "prompt": "long", "max_tokens": 2000, "stream": True}
    with slow_server.http() as http, http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert slow_server.async_engine.num_in_flight == 1
    assert wait_until(lambda: slow_server.async_engine.num_in_flight == 0)
    assert finished_by(slow_server, "abort") >= 1


def test_a_waiting_client_that_hangs_up_is_aborted(slow_server):
    before = finished_by(slow_server, "abort")
    body = {"model": MODEL, "prompt": "long", "max_tokens": 2000}
    with slow_server.http() as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body, timeout=0.3)
    assert wait_until(lambda: slow_server.async_engine.num_in_flight == 0)
    assert finished_by(slow_server, "abort") == before + 1
