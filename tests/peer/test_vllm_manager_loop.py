"""vLLM's KVCacheManager in the peer's minimal step loop (`manager_replay`) against its full
Scheduler (`replay`): the loop vs_vllm.py times must hit and chunk exactly as vLLM does, or its
speed would be that of some other cache."""

from __future__ import annotations

import pytest

from benchmarks.peer.client import PeerError
from tests.peer.conftest import family_trace

GEOMETRIES = [
    {"block_size": 16, "mamba_block_size": 512, "prefix_match_unit": 16},
    {"block_size": 64, "mamba_block_size": 256, "prefix_match_unit": 64},
]


@pytest.mark.parametrize("partial_hits", [True, False], ids=["partial", "aligned"])
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["Ba16-Bm512", "Ba64-Bm256"])
def test_the_minimal_loop_hits_and_chunks_as_the_scheduler(
    vllm, geometry: dict, concurrency: int, partial_hits: bool
) -> None:
    requests = [{**r, "max_tokens": 3} for r in family_trace(3)]
    geometry = {**geometry, "partial_hits": partial_hits, "num_blocks": 16384}
    scheduler = vllm.replay_timed(requests, geometry, concurrency)
    manager = vllm.replay_timed(requests, geometry, concurrency, loop="manager")
    differ = [
        (ours["id"], ours["num_cached_tokens"], theirs["num_cached_tokens"])
        for ours, theirs in zip(manager["records"], scheduler["records"], strict=True)
        if ours != theirs
    ]
    assert not differ, f"minimal loop vs Scheduler (id, hit, hit): {differ[:10]}"


def test_the_minimal_loop_refuses_eagle(vllm) -> None:
    with pytest.raises(PeerError, match="--eagle"):
        vllm.replay_timed(family_trace(1)[:2], {"eagle": True}, loop="manager")
