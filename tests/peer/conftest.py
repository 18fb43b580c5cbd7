"""The peer tests: Junction beside vLLM 0.33 (benchmarks/peer). They need `.venv-peer`
(`make peer`) and are skipped without it; one vLLM `serve` process answers the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from benchmarks.peer.client import PeerProcess, peer_python
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.traces.replay import replay
from engine.traces.trace import TraceRequest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="no .venv-peer: run `make peer` to build vLLM's peer")
    for item in items:
        if "tests/peer/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.peer)
            if peer_python() is None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm() -> Iterator[PeerProcess]:
    with PeerProcess() as peer:
        yield peer


def family_trace(
    seed: int, num_families: int = 4, num_requests: int = 30, max_prompt: int = 3000
) -> list[dict]:
    """Families of shared-prefix prompts, interleaved: each family a random prefix (which may
    end anywhere, not only on block boundaries), its requests that prefix plus a unique
    suffix; some requests resend or extend an earlier sibling's whole prompt."""
    rng = np.random.default_rng(seed)
    prefixes = [
        rng.integers(0, 256, int(rng.integers(40, 2000))).tolist() for _ in range(num_families)
    ]
    sent: list[list[int]] = []
    requests = []
    for n in range(num_requests):
        kind = rng.random()
        if sent and kind < 0.1:  # an exact resend
            prompt = list(sent[int(rng.integers(len(sent)))])
        elif sent and kind < 0.2:  # a later turn: an earlier prompt extended
            base = sent[int(rng.integers(len(sent)))]
            room = max_prompt - len(base)
            prompt = base + rng.integers(0, 256, int(rng.integers(1, max(room, 2)))).tolist()
        else:
            prefix = prefixes[int(rng.integers(num_families))]
            room = max_prompt - len(prefix)
            prompt = prefix + rng.integers(0, 256, int(rng.integers(1, room))).tolist()
        prompt = prompt[:max_prompt]
        sent.append(prompt)
        requests.append({"id": f"s{seed}-r{n}", "prompt_token_ids": prompt, "max_tokens": 1})
    return requests


def junction_replay(
    requests: list[dict], geometry: dict, concurrency: int = 1, **cache_options: object
) -> list[dict]:
    """Junction's null-runner replay of expanded requests, in process (`junction replay
    --runner null`); `geometry` is the peer's geometry dict."""
    cache = CacheConfig(
        block_size=geometry.get("block_size", 16),
        mamba_block_size=geometry.get("mamba_block_size", 512),
        prefix_match_unit=geometry.get("prefix_match_unit"),
        partial_hits=geometry.get("partial_hits", True),
        eagle=geometry.get("eagle", False),
        num_blocks=geometry.get("num_blocks", 4096),
        num_mamba_blocks=geometry.get("num_mamba_blocks"),
        **cache_options,
    )
    scheduler = SchedulerConfig(
        max_num_batched_tokens=geometry.get("max_num_batched_tokens", 8192),
        long_prefill_threshold=geometry.get("long_prefill_threshold", 0),
    )
    engine = Engine(cache, scheduler, runner="null")
    items = [
        TraceRequest(
            line=n,
            request_id=r["id"],
            token_ids=r["prompt_token_ids"],
            max_tokens=r.get("max_tokens", 1),
            cache_salt=None,
            temperature=0.0,
            top_p=1.0,
            seed=None,
        )
        for n, r in enumerate(requests, start=1)
    ]
    records, _ = replay(engine, items, concurrency)
    return records
