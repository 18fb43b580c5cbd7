"""In-flight prefix sharing: requests that arrive together share what one of them computes.

A waiting request whose prefix an in-flight request is computing now waits for it (bounded)
instead of recomputing it, and the producer keeps the state where the two part, so the waiter
hits there. Every run here checks the ledger and the invariants after each step.
"""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.traces.replay import replay
from tests.engine.conftest import tokens
from workloads import build_workload, oracle

GEOMETRY = {"block_size": 16, "mamba_block_size": 512, "prefix_match_unit": 16}


def engine(wait_steps: int = 32, chunk_cap: int = 0, **cache) -> Engine:
    """`chunk_cap` (the long-prefill threshold) holds a producer back so waiters see it."""
    return Engine(
        CacheConfig(**{**GEOMETRY, "num_blocks": 4096, **cache}),
        SchedulerConfig(long_prefill_threshold=chunk_cap, max_prefix_wait_steps=wait_steps),
        runner="ledger",
    )


def run(e: Engine, items, concurrency: int):
    records, summary = replay(e, items, concurrency, on_step=lambda en: en.check_invariants())
    return records, summary


def family(num: int, system_len: int = 2000, question_len: int = 200) -> dict:
    return {
        "kind": "generated_shared_prefix",
        "num_groups": 1,
        "prompts_per_group": num,
        "system_prompt_len": system_len,
        "question_len": question_len,
        "output_len": 4,
    }


@pytest.mark.parametrize("mode", ["inline", "stops"])
def test_a_burst_of_one_family_hits_its_oracle(mode):
    """Eight requests of one family, all in flight at once: the first computes the system
    prompt and keeps its state at the end of it; the other seven wait and hit it."""
    items = build_workload(family(8)).items()
    records, summary = run(engine(checkpoint_mode=mode), items, concurrency=8)
    best = oracle(items, 16).num_oracle_tokens
    assert best == 7 * 2000
    assert summary.num_cached_tokens >= 0.95 * best
    assert sorted(r["num_cached_tokens"] for r in records) == [0] + [2000] * 7


def test_without_waiting_the_burst_recomputes_the_prefix():
    """The same burst with waiting turned off: the requests admitted in the first step beside
    the first one compute the whole prefix again."""
    items = build_workload(family(8)).items()
    records, summary = run(engine(wait_steps=0), items, concurrency=8)
    assert summary.num_cached_tokens <= 0.8 * oracle(items, 16).num_oracle_tokens
    assert sum(1 for r in records if r["num_cached_tokens"] == 0) >= 2


def test_concurrency_keeps_the_hit_rate_of_one_request_at_a_time():
    workload = {
        "kind": "generated_shared_prefix",
        "num_groups": 8,
        "prompts_per_group": 8,
        "system_prompt_len": 1000,
        "question_len": 100,
        "output_len": 8,
    }
    items = build_workload(workload).items()
    _, alone = run(engine(), items, concurrency=1)
    _, together = run(engine(), items, concurrency=8)
    assert together.hit_rate >= alone.hit_rate - 0.03


def test_the_wait_is_bounded():
    """A producer held back by a tiny budget: its waiter gives up after the cap and goes
    ahead on what is cached."""
    shared = tokens(1, 2000)
    e = engine(wait_steps=2, chunk_cap=256)
    producer = e.add_request(shared + tokens(2, 100), SamplingParams(max_tokens=1))
    waiter = e.add_request(shared + tokens(3, 100), SamplingParams(max_tokens=1))
    e.step()
    assert waiter in e.scheduler.waiting
    e.run_until_done()
    assert waiter.num_wait_steps == 2
    assert waiter.num_cached_tokens < 2000  # it went before the producer had computed 2000
    assert producer.finish_reason == waiter.finish_reason == "length"


def test_an_aborted_producer_releases_its_waiter():
    shared = tokens(4, 2000)
    e = engine(chunk_cap=256)
    producer = e.add_request(shared + tokens(5, 100), SamplingParams(max_tokens=1))
    waiter = e.add_request(shared + tokens(6, 100), SamplingParams(max_tokens=1))
    e.step()
    assert waiter in e.scheduler.waiting and waiter.num_wait_steps == 1
    e.abort(producer.request_id)
    e.step()
    assert waiter not in e.scheduler.waiting
    e.run_until_done()
    e.check_invariants()
    assert waiter.num_wait_steps == 1
    assert waiter.finish_reason == "length"


def test_an_unrelated_request_goes_ahead_of_a_waiter():
    """Waiting does not block the queue: a request sharing nothing is admitted at once."""
    shared = tokens(7, 2000)
    e = engine()
    e.add_request(shared + tokens(8, 100), SamplingParams(max_tokens=1))
    waiter = e.add_request(shared + tokens(9, 100), SamplingParams(max_tokens=1))
    stranger = e.add_request(tokens(10, 300), SamplingParams(max_tokens=1))
    e.step()
    assert waiter in e.scheduler.waiting
    assert stranger not in e.scheduler.waiting
    e.run_until_done()
    assert waiter.num_cached_tokens == 2000
