"""Junction's hits against vLLM 0.33's on the same shared-prefix traces (docs/rules.md section 3).

Block-aligned (partial hits off on both sides), with Junction's `checkpoint_mode="stops"` (a
Mamba state is written only where a chunk ends, which is what vLLM's "align" mode does), the
two agree request by request: the same hits and the same prefill chunks. With partial hits on,
and in either checkpoint mode, Junction's finer lookup and extra checkpoints never hit less
than vLLM does.
"""

from __future__ import annotations

import pytest

from tests.peer.conftest import family_trace, junction_replay

GEOMETRIES = [
    {"block_size": 16, "mamba_block_size": 512, "prefix_match_unit": 16},
    {"block_size": 64, "mamba_block_size": 256, "prefix_match_unit": 64},
    {"block_size": 32, "mamba_block_size": 1024, "prefix_match_unit": 32},
]
# enough blocks that neither side evicts: the comparison is of lookup rules, not of LRU order
POOL = {"num_blocks": 16384}
SEEDS = (1, 2)


def _cases() -> list:
    return [
        pytest.param(
            seed,
            {**geometry, "eagle": eagle, **POOL},
            id=f"s{seed}-Ba{geometry['block_size']}-Bm{geometry['mamba_block_size']}"
            f"-U{geometry['prefix_match_unit']}{'-eagle' if eagle else ''}",
        )
        for seed in SEEDS
        for geometry in GEOMETRIES
        for eagle in (False, True)
    ]


def _by_id(records: list[dict], field: str) -> dict[str, object]:
    return {r["id"]: r[field] for r in records}


def _report(requests: list[dict], ours: dict, theirs: dict, ids: list[str]) -> str:
    lengths = {r["id"]: len(r["prompt_token_ids"]) for r in requests}
    return "\n".join(f"{i}: P={lengths[i]} junction={ours[i]} vllm={theirs[i]}" for i in ids)


@pytest.mark.parametrize(("seed", "geometry"), _cases())
def test_block_aligned_equals_vllm(vllm, seed: int, geometry: dict) -> None:
    geometry = {**geometry, "partial_hits": False}
    requests = family_trace(seed)
    ours = junction_replay(requests, geometry, junction_checkpoints=True, checkpoint_mode="stops")
    theirs = vllm.replay(requests, geometry)
    for field in ("num_cached_tokens", "chunks"):
        mine, peer = _by_id(ours, field), _by_id(theirs, field)
        differ = [i for i in mine if mine[i] != peer[i]]
        assert not differ, f"{field} differ:\n" + _report(requests, mine, peer, differ)


@pytest.mark.parametrize("policy", [{}, {"checkpoint_mode": "stops"}], ids=["defaults", "stops"])
@pytest.mark.parametrize(("seed", "geometry"), _cases())
def test_partial_hits_never_below_vllm(vllm, seed: int, geometry: dict, policy: dict) -> None:
    """Junction as shipped (no options: junction checkpoints on, written inline), and in stops
    mode, hits at least what vLLM hits on every request."""
    requests = family_trace(seed)
    ours = _by_id(junction_replay(requests, geometry, **policy), "num_cached_tokens")
    theirs = _by_id(vllm.replay(requests, geometry), "num_cached_tokens")
    lower = [i for i in ours if ours[i] < theirs[i]]
    assert not lower, "junction hits less:\n" + _report(requests, ours, theirs, lower)


AGENTS = {
    "kind": "agentic",
    "num_sessions": 16,
    "num_steps": 6,
    "system_prompt_len": 2000,
    "task_len": 200,
    "tool_output_len": 500,
    "action_len": 50,
}


@pytest.mark.parametrize("num_blocks", [1200, 2400])
def test_under_pool_pressure_the_defaults_hit_at_least_vllms_total(vllm, num_blocks: int) -> None:
    """16 agents in flight on pools that cannot hold their contexts: blocks are evicted and
    requests preempted on both sides; Junction's total hit stays at or above vLLM's (whose
    one pool holds both groups' blocks, as many as Junction's two together)."""
    from benchmarks.peer.client import expanded_request
    from workloads import build_workload

    requests = [expanded_request(item) for item in build_workload(AGENTS).items()]
    geometry = {
        "block_size": 16,
        "mamba_block_size": 512,
        "prefix_match_unit": 16,
        "num_blocks": num_blocks,
        "num_mamba_blocks": num_blocks // 16,
    }
    ours = sum(r["num_cached_tokens"] for r in junction_replay(requests, geometry, 16))
    theirs = sum(r["num_cached_tokens"] for r in vllm.replay(requests, geometry, 16))
    assert ours >= theirs > 0


def test_the_pressure_benchmark_runs_vllm_by_bytes_in_pages_of_the_mamba_block(vllm) -> None:
    """`benchmarks/pressure.py`'s second vLLM run: pages of `Bm` tokens, as many as Junction's
    two pools hold in bytes. Its hits land on `Bm` multiples (one page size: `Ba == Bm`), and
    with fewer pages (the same bytes) it keeps no more than with a state costing one block."""
    from benchmarks.pressure_cells import MAMBA_BLOCK_SIZE, same_bytes_pages, vllm_tokens
    from engine.traces.trace import TraceRequest
    from workloads.bound import Budget

    requests = [
        TraceRequest(i + 1, f"r{i}", ids, 4, None, 0.0, 1.0, None)
        for i, ids in enumerate(
            [list(range(1, 1201)) + [2000 + i] * 60 for i in range(6)]  # 1200 shared tokens
        )
    ]
    budget = Budget(400, 12)
    assert same_bytes_pages(budget) == (400 * 16 // MAMBA_BLOCK_SIZE, 12)
    by_bytes = vllm_tokens(vllm, requests, budget, 1, by_bytes=True)
    by_blocks = vllm_tokens(vllm, requests, budget, 1)
    assert by_bytes == 5 * 1024  # every sibling hits the last full page of the shared prefix
    assert by_blocks >= by_bytes
