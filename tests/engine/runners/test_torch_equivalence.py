"""The torch runner: outputs with the cache on equal outputs with the cache off.

Random traces with shared prefixes, partial hits, junction checkpoints, both checkpoint modes
and pools small enough to evict and preempt: greedy tokens are equal and every sampled step's
logits agree within 1e-4 (float32).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.runners.torch_runner import TorchRunner
from tests.engine.conftest import TINY_MODEL
from tests.engine.ledger_harness import Harness, Submission, sized_pools

SMALL_MODEL = TINY_MODEL


def run_trace(
    cache: CacheConfig,
    scheduler: SchedulerConfig,
    model: ModelConfig,
    submissions: list[Submission],
    concurrency: int,
):
    """Returns the requests and the logits of every sampled step, by (request, token index)."""
    runner = TorchRunner(cache, model, record_logits=True)
    engine = Engine(cache, scheduler, model, runner=runner)
    logits: dict[tuple[str, int], torch.Tensor] = {}

    def collect(e: Engine) -> None:
        for request_id, row in e.last_result.logits.items():
            index = sum(1 for key in logits if key[0] == request_id)
            logits[(request_id, index)] = row

    requests = Harness(engine, concurrency=concurrency, on_step=collect).run(submissions)
    return requests, logits


def assert_equivalent(
    cache: CacheConfig,
    scheduler: SchedulerConfig,
    model: ModelConfig,
    submissions: list[Submission],
    concurrency: int = 1,
) -> list:
    on, on_logits = run_trace(cache, scheduler, model, submissions, concurrency)
    off_cache = CacheConfig(
        **{
            **cache.__dict__,
            "enable_prefix_caching": False,
            "num_blocks": 4096,
            "num_mamba_blocks": 256,
        }
    )
    off, off_logits = run_trace(off_cache, scheduler, model, submissions, concurrency)
    assert [r.output_token_ids for r in on] == [r.output_token_ids for r in off]
    assert on_logits.keys() == off_logits.keys()
    for key, row in on_logits.items():
        torch.testing.assert_close(row, off_logits[key], atol=1e-4, rtol=0, msg=str(key))
    return on


def family(seed: int, shared: int, num: int, tail: int) -> list[Submission]:
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(shared)]
    return [
        Submission(
            prefix + [rng.randrange(256) for _ in range(rng.randint(1, tail))],
            max_tokens=rng.randint(1, 6),
        )
        for _ in range(num)
    ]


def check_shared_prefix_family(model: ModelConfig, mode: str, eagle: bool, size: int) -> None:
    """A family of `size` prompts on a 70-token prefix, partial hits (unit 4 inside blocks of
    8 and 32) in `mode`, with or without EAGLE: cache-on equals cache-off, and it hits."""
    cache = CacheConfig(
        block_size=8,
        mamba_block_size=32,
        prefix_match_unit=4,
        num_blocks=256,
        num_mamba_blocks=64,
        checkpoint_mode=mode,
        eagle=eagle,
        junction_checkpoints=True,
    )
    requests = assert_equivalent(
        cache, SchedulerConfig(max_num_batched_tokens=48), model, family(1, 70, size, 40)
    )
    assert sum(r.num_cached_tokens for r in requests) > 0


def check_multi_turn_extension(model: ModelConfig, first_len: int) -> None:
    """A next turn that extends the first hits the whole first turn (the extension state)."""
    cache = CacheConfig(
        block_size=16,
        mamba_block_size=64,
        prefix_match_unit=16,
        num_blocks=128,
        num_mamba_blocks=32,
    )
    first = family(2, first_len, 1, 10)[0]
    turns = [first, Submission([7] * 33, max_tokens=3, extends_previous=True)]
    requests = assert_equivalent(cache, SchedulerConfig(), model, turns)
    assert requests[1].num_cached_tokens == len(first.token_ids) // 16 * 16


@pytest.mark.parametrize("mode", ["stops", "inline"])
@pytest.mark.parametrize("eagle", [False, True])
def test_shared_prefix_family_matches_cache_off(mode, eagle):
    check_shared_prefix_family(SMALL_MODEL, mode, eagle, size=6)


def test_default_model_multi_turn_extension_hit():
    check_multi_turn_extension(ModelConfig(), first_len=300)


@st.composite
def traces(draw):
    unit = draw(st.sampled_from([2, 4]))
    cache = CacheConfig(
        block_size=unit * draw(st.sampled_from([1, 2, 4])),
        mamba_block_size=unit * draw(st.sampled_from([2, 4, 8])),
        prefix_match_unit=unit,
        eagle=draw(st.booleans()),
        partial_hits=draw(st.booleans()) or draw(st.booleans()),
        junction_checkpoints=draw(st.booleans()),
        checkpoint_mode=draw(st.sampled_from(["stops", "inline"])),
        checkpoint_interval=draw(st.sampled_from([None, 0, unit, 2 * unit])),
    )
    seed = draw(st.integers(0, 2**31))
    submissions = family(seed, draw(st.integers(4, 60)), draw(st.integers(2, 6)), 50)
    cache = sized_pools(cache, submissions, draw(st.integers(0, 16)))
    return cache, submissions, draw(st.integers(1, 4)), draw(st.integers(8, 64))


@settings(
    max_examples=int(os.environ.get("JUNCTION_TORCH_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(traces())
def test_random_traces_match_cache_off(trace):
    cache, submissions, concurrency, budget = trace
    assert_equivalent(
        cache, SchedulerConfig(max_num_batched_tokens=budget), SMALL_MODEL, submissions, concurrency
    )


def check_preemption(model: ModelConfig) -> None:
    """Four requests in flight on a pool too small for them: preempted ones are recomputed,
    and cache-on still equals cache-off."""
    cache = CacheConfig(
        block_size=4, mamba_block_size=8, prefix_match_unit=2, num_blocks=24, num_mamba_blocks=24
    )
    subs = family(3, 40, 4, 20)
    for sub in subs:
        sub.max_tokens = 16
    requests = assert_equivalent(
        cache, SchedulerConfig(max_num_batched_tokens=32), model, subs, concurrency=4
    )
    assert sum(r.num_preemptions for r in requests) > 0


def test_preemption_under_a_small_pool_matches_cache_off():
    check_preemption(SMALL_MODEL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cache_off():
    model = ModelConfig(device="cuda")
    cache = CacheConfig(
        block_size=16,
        mamba_block_size=64,
        prefix_match_unit=16,
        num_blocks=256,
        num_mamba_blocks=64,
        junction_checkpoints=True,
    )
    assert_equivalent(
        cache,
        SchedulerConfig(max_num_batched_tokens=128),
        model,
        family(4, 200, 5, 120),
        concurrency=3,
    )
