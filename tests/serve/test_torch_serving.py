"""The server on the real model: chat over the torch runner, a shared system prompt reused."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.runners.torch_runner import TorchRunner
from tests.engine.conftest import TINY_MODEL
from tests.serve.conftest import MODEL, serve

TINY = TINY_MODEL
SYSTEM = "You are Junction's test assistant. Answer in one short sentence. " * 4


@pytest.fixture(scope="module")
def torch_server():
    cache = CacheConfig(
        block_size=16,
        mamba_block_size=64,
        prefix_match_unit=16,
        num_blocks=256,
        num_mamba_blocks=64,
        junction_checkpoints=True,
    )
    engine = Engine(cache, SchedulerConfig(), TINY, runner=TorchRunner(cache, TINY))
    yield from serve(engine)


def test_chat_reuses_the_system_prompt_and_greedy_is_deterministic(torch_server):
    client = torch_server.client()

    def ask(question: str):
        return client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=6,
            temperature=0,
        )

    first = ask("What is a Mamba layer?")
    second = ask("What is attention?")
    third = ask("What is a junction?")
    again = ask("What is a junction?")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # the second request materializes the junction where the conversations part ways
    assert third.usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) // 16 * 16
    assert second.usage.completion_tokens == 6
    assert again.choices[0].message.content == third.choices[0].message.content


def test_streamed_completion_matches_the_plain_one(torch_server):
    client = torch_server.client()
    prompt = SYSTEM + "Stream this."
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
