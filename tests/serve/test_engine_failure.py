"""An engine that crashes mid-step: the client waiting gets an error event (streaming) or a
503, `/health` turns 503, later requests are refused, and the server itself stays up."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from engine.config import ModelConfig
from engine.runners.null import NullRunner
from tests.serve.conftest import MODEL, LiveServer, serve, small_engine


class BrokenRunner(NullRunner):
    """Fails in its forward pass after a few steps, as a bug in a real model would."""

    def __init__(self, num_good_steps: int) -> None:
        super().__init__(ModelConfig())
        self.num_good_steps = num_good_steps

    def forward(self, chunks):
        self.num_good_steps -= 1
        if self.num_good_steps < 0:
            raise RuntimeError("the forward pass broke")
        return super().forward(chunks)


@pytest.fixture
def broken_server() -> Iterator[LiveServer]:
    yield from serve(small_engine(BrokenRunner(num_good_steps=3)))


def test_a_crash_mid_stream_is_an_error_event(broken_server):
    stream = broken_server.client().completions.create(
        model=MODEL, prompt="boom", max_tokens=50, stream=True
    )
    texts = []
    with pytest.raises(openai.APIError, match="forward pass broke"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert 1 <= len(texts) <= 3  # at most a chunk a good step (a split character waits)
    with broken_server.http() as http:
        health = http.get("/health")
        metrics = http.get("/metrics")
        blocks = http.get("/debug/blocks")
    assert health.status_code == 503 and "forward pass broke" in health.json()["error"]["message"]
    assert metrics.status_code == 200 and "junction_requests_total 1.0" in metrics.text
    assert blocks.status_code == 503
    with pytest.raises(openai.InternalServerError, match="engine loop stopped") as info:
        broken_server.client().completions.create(model=MODEL, prompt="again")
    assert info.value.status_code == 503


def test_a_crash_under_a_waiting_request_is_a_503(broken_server):
    with pytest.raises(openai.InternalServerError, match="forward pass broke") as info:
        broken_server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=50
        )
    assert info.value.status_code == 503
