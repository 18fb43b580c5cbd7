"""A live engine server per test module: uvicorn on a free port in a background thread, an
`Engine` on the `null` or `ledger` runner with small geometry, and an official OpenAI client."""

from __future__ import annotations

import random
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import RequestFinished
from engine.runners.base import Runner
from engine.runners.null import NullRunner
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk
from serve.app import create_app
from serve.async_engine import AsyncEngine
from tests.engine.conftest import checkpoints  # noqa: F401 (the session's small checkpoints)
from tests.uvicorn_thread import uvicorn_thread

MODEL = "junction-test"
MAX_MODEL_LEN = 4096


def finished_event(request_id: str) -> RequestFinished:
    """A small finished request's record, as the engine emits it."""
    return RequestFinished(
        request_id=request_id,
        num_prompt_tokens=10,
        num_cached_tokens=4,
        hit_tokens_by_group={"attention": 4, "mamba": 4},
        num_computed_tokens=6,
        num_output_tokens=1,
        chunks=[(4, 10)],
        chunk_stop_reasons=["end"],
        checkpoints=[8],
        num_preemptions=0,
        finish_reason="length",
        arrival_ts=1.0,
        first_token_ts=1.5,
        finished_ts=2.0,
        ttft_s=0.5,
    )


def small_engine(runner: str | Runner = "null") -> Engine:
    return Engine(
        CacheConfig(block_size=16, mamba_block_size=64, num_blocks=512),
        SchedulerConfig(max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN),
        runner=runner,
        engine_id="engine-test",
    )


@dataclass
class LiveServer:
    base_url: str
    async_engine: AsyncEngine

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0, **kwargs)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=10)


def serve(engine: Engine) -> Iterator[LiveServer]:
    async_engine = AsyncEngine(engine)
    app = create_app(async_engine, MODEL)
    with uvicorn_thread(app, lifespan="on") as url:
        yield LiveServer(url, async_engine)


@pytest.fixture(scope="module", params=["null", "ledger"])
def live_server(request) -> Iterator[LiveServer]:
    yield from serve(small_engine(request.param))


@pytest.fixture
def client(live_server: LiveServer) -> openai.OpenAI:
    return live_server.client()


class SlowRunner(NullRunner):
    """The null runner, slowed down so a request is still running when a test acts on it."""

    def __init__(self, delay_s: float = 0.005) -> None:
        super().__init__(ModelConfig())
        self.delay_s = delay_s

    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        time.sleep(self.delay_s)
        return super().forward(chunks)


def text_prompt(seed: int, length: int = 600) -> str:
    """ASCII text of `length` bytes (so tokens), the same for the same seed."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + " ") for _ in range(length))
