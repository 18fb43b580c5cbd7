"""The cells of `benchmarks/pressure.py`: a workload family at a memory level and a concurrency,
run through every eviction policy and through vLLM, beside the bound and the oracle.

A level is a share of the family's working set (`workloads.bound.working_set`: every
distinct attention block and resume state the trace has, plus what is in flight), both pools
scaled alike, and never below the floor the engine needs to run the requests in flight: the
blocks the bound's in-flight window holds (and one request's blocks), and the Mamba slots it
would hold if each held its first chunk's slots all the while (one per `Bm` of each sequence
in flight past its hit: more than the bound's window holds), plus 4.

vLLM runs each cell twice. **By blocks**: its one pool gets `num_blocks + num_mamba_blocks`
blocks of `Ba` tokens, a state taking one of them, as if a state cost the bytes of `Ba` tokens
of keys and values (generous to vLLM: it may hold hundreds of states where Junction holds a
few). **By bytes**: as vLLM runs a real hybrid model, one page size for both groups, the
attention block grown until its keys and values take a state's bytes (vLLM's align mode then
makes `Ba == Bm`): for a model whose state takes the bytes of `Bm` tokens of attention, pages of
`Bm` tokens, as many as Junction's two pools hold in bytes (`same_bytes_pages`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from benchmarks.peer.client import PeerProcess, expanded_request
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.traces.replay import replay
from engine.traces.trace import TraceRequest
from workloads import build_workload, oracle
from workloads.bound import Budget, bound, in_flight_need, working_set

BLOCK_SIZE, MAMBA_BLOCK_SIZE, UNIT = 16, 512, 16  # Ba, Bm, U (docs/rules.md)
LEVELS = (0.25, 0.5, 1.0)  # shares of the working set
CONCURRENCIES = (1, 16)

#: the four workload families, sized so one full run takes a few minutes on two cores
FAMILIES = {
    "shared system prompts": {
        "kind": "generated_shared_prefix",
        "num_groups": 24,
        "prompts_per_group": 8,
        "system_prompt_len": 1024,
        "question_len": 128,
        "output_len": 16,
    },
    "multi-turn agents": {
        "kind": "agentic",
        "num_sessions": 40,
        "num_steps": 5,
        "system_prompt_len": 1000,
        "task_len": 200,
        "tool_output_len": 200,
        "action_len": 30,
    },
    "prefix repetition": {
        "kind": "prefix_repetition",
        "num_prefixes": 24,
        "prefix_len": 768,
        "suffix_len": 256,
        "num_prompts": 192,
        "output_len": 16,
    },
    "chat with tools": {
        "kind": "chat_agentic",
        "num_sessions": 36,
        "num_steps": 5,
        "system_prompt_len": 800,
        "task_len": 100,
        "tool_output_len": 150,
        "action_len": 30,
    },
}


class Cell(NamedTuple):
    family: str
    concurrency: int
    level: float  # the share of the working set asked for
    budget: Budget  # the pools every engine gets
    is_floored: bool  # the share fell below the floor: the floor was taken
    num_prompt_tokens: int
    oracle_tokens: int  # the memory-free oracle
    bound_tokens: int  # the bound under memory at `budget`
    blind_tokens: int  # the order-blind reference at `budget` (how often, not when)
    policy_tokens: dict[str, int]  # hit tokens per eviction policy
    vllm_tokens: int | None  # by blocks; None without the peer
    vllm_bytes_tokens: int | None  # by bytes; None without the peer


def family_requests(name: str) -> list[TraceRequest]:
    items = build_workload(FAMILIES[name]).items(with_pins=False)
    return [item for item in items if isinstance(item, TraceRequest)]


def level_budgets(
    requests: list[TraceRequest], concurrency: int
) -> list[tuple[float, Budget, bool]]:
    """Each level's budget and whether the floor raised it."""
    whole = working_set(requests, UNIT, BLOCK_SIZE, concurrency, mamba_block_size=MAMBA_BLOCK_SIZE)
    need = in_flight_need(
        requests, UNIT, BLOCK_SIZE, concurrency, mamba_block_size=MAMBA_BLOCK_SIZE
    )
    longest = max(len(r.token_ids) + r.max_tokens for r in requests)
    floor = Budget(
        max(need.num_blocks, math.ceil(longest / BLOCK_SIZE) + 1),
        max(need.num_mamba_blocks, math.ceil(longest / MAMBA_BLOCK_SIZE)) + 4,
    )
    budgets = []
    for level in LEVELS:
        asked = Budget(
            math.ceil(whole.num_blocks * level), math.ceil(whole.num_mamba_blocks * level)
        )
        budget = Budget(max(asked[0], floor[0]), max(asked[1], floor[1]))
        budgets.append((level, budget, budget != asked))
    return budgets


def junction_tokens(
    requests: list[TraceRequest], budget: Budget, concurrency: int, eviction: str
) -> int:
    """Hit tokens of Junction's engine (its defaults, the null runner) with policy `eviction`."""
    cache = CacheConfig(
        block_size=BLOCK_SIZE,
        mamba_block_size=MAMBA_BLOCK_SIZE,
        prefix_match_unit=UNIT,
        num_blocks=budget.num_blocks,
        num_mamba_blocks=budget.num_mamba_blocks,
        eviction=eviction,
    )
    engine = Engine(cache, SchedulerConfig(), runner="null", engine_id=f"pressure-{eviction}")
    _, summary = replay(engine, requests, concurrency)
    return summary.num_cached_tokens


def same_bytes_pages(budget: Budget) -> tuple[int, int]:
    """vLLM's pages of `Bm` tokens holding Junction's bytes, as (pages for the attention
    blocks' bytes, pages for the state slots'): `num_blocks * Ba / Bm` (floored) and one a
    state. The peer's pool gets their sum."""
    return budget.num_blocks * BLOCK_SIZE // MAMBA_BLOCK_SIZE, budget.num_mamba_blocks


def vllm_tokens(
    peer: PeerProcess,
    requests: list[TraceRequest],
    budget: Budget,
    concurrency: int,
    by_bytes: bool = False,
) -> int:
    """Hit tokens of vLLM's scheduler; its one pool gets both budgets' blocks, or with
    `by_bytes` the pages of `Bm` tokens that hold their bytes."""
    block_size, (num_blocks, num_mamba_blocks) = BLOCK_SIZE, budget
    if by_bytes:
        block_size, (num_blocks, num_mamba_blocks) = MAMBA_BLOCK_SIZE, same_bytes_pages(budget)
    geometry = {
        "block_size": block_size,
        "mamba_block_size": MAMBA_BLOCK_SIZE,
        "prefix_match_unit": UNIT,
        "num_blocks": num_blocks,
        "num_mamba_blocks": num_mamba_blocks,
    }
    records = peer.replay([expanded_request(r) for r in requests], geometry, concurrency)
    return sum(record["num_cached_tokens"] for record in records)


def run_cell(
    family: str,
    requests: list[TraceRequest],
    concurrency: int,
    level: tuple[float, Budget, bool],
    policies: list[str],
    peer: PeerProcess | None,
) -> Cell:
    share, budget, is_floored = level
    best = oracle(requests, UNIT)
    kept, blind = (
        bound(
            requests,
            UNIT,
            BLOCK_SIZE,
            budget,
            concurrency,
            mamba_block_size=MAMBA_BLOCK_SIZE,
            order_blind=order_blind,
        )
        for order_blind in (False, True)
    )
    return Cell(
        family,
        concurrency,
        share,
        budget,
        is_floored,
        best.num_prompt_tokens,
        best.num_oracle_tokens,
        kept.num_bound_tokens,
        blind.num_bound_tokens,
        {name: junction_tokens(requests, budget, concurrency, name) for name in policies},
        None if peer is None else vllm_tokens(peer, requests, budget, concurrency),
        None if peer is None else vllm_tokens(peer, requests, budget, concurrency, by_bytes=True),
    )
