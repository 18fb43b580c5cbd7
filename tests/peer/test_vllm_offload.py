"""The peer's offloading mode: vLLM's own `OffloadingConnector` (CPU, LRU) in its Scheduler,
transfers reported done at once. On prefixes that overflow the device pool it loads them back
from its CPU tier, so it hits where vLLM without offloading does not; its CPU tier holds the
chunks vLLM sizes from `cpu_bytes_to_use`."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.peer.client import PeerError

PAGE = 524288


def round_robin(num_prefixes: int = 6, num_rounds: int = 3) -> list[dict]:
    """Prefixes of 2048 tokens read in turn, each request the prefix and its own suffix."""
    rng = np.random.default_rng(5)
    prefixes = [rng.integers(0, 256, 2048).tolist() for _ in range(num_prefixes)]
    return [
        {
            "id": f"r{n}-p{i}",
            "prompt_token_ids": prefix + rng.integers(0, 256, 100).tolist(),
            "max_tokens": 2,
        }
        for n in range(num_rounds)
        for i, prefix in enumerate(prefixes)
    ]


def geometry(cpu_bytes: int) -> dict:
    return {
        "block_size": 512,
        "mamba_block_size": 512,
        "prefix_match_unit": 16,
        "num_blocks": 10,
        "num_mamba_blocks": 6,
        "cpu_bytes": cpu_bytes,
        "page_bytes": PAGE,
    }


def test_offloading_hits_what_the_device_pool_gave_up(vllm) -> None:
    requests = round_robin()
    off = vllm.replay_timed(requests, geometry(0), 1)
    on = vllm.replay_timed(requests, geometry(64 * PAGE), 1)
    assert "offload" not in off
    assert sum(r["num_cached_tokens"] for r in off["records"]) == 0  # the pool cycles
    offload = on["offload"]
    assert offload["connector"] == "OffloadingConnector"
    assert offload["num_cpu_chunks"] == 64
    assert offload["num_chunks_stored"] > 0 and offload["num_load_jobs"] > 0
    # every read after the first round finds its prefix's 4 chunks in the CPU tier
    hits = [r["num_cached_tokens"] for r in on["records"]]
    assert hits == [0] * 6 + [2048] * 12


def test_cpu_bytes_need_the_page_bytes(vllm) -> None:
    with pytest.raises(PeerError, match="--page-bytes"):
        vllm.replay_timed(round_robin(1, 1), {"cpu_bytes": PAGE}, 1)
