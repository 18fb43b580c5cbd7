"""Cache on equals cache off on each real architecture's small checkpoint.

A focused subset of `test_torch_equivalence` (shared prefixes with partial hits, both
checkpoint modes and EAGLE; a multi-turn extension hit; preemption; random traces over both
checkpoint modes, EAGLE and pool sizes) and the consumer copy-on-write check, with the model
a Hugging Face checkpoint: Bamba, Granite dense and with experts, and Nemotron-H. Greedy tokens
are equal and every sampled step's logits agree within 1e-4 (float32).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.runners.torch_runner import TorchRunner
from tests.engine.conftest import tokens
from tests.engine.model.hf_checkpoints import VARIANTS
from tests.engine.runners.test_torch_copy_on_write import CACHE as COPY_CACHE
from tests.engine.runners.test_torch_equivalence import (
    assert_equivalent,
    check_multi_turn_extension,
    check_preemption,
    check_shared_prefix_family,
    traces,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request, checkpoints) -> ModelConfig:
    return ModelConfig(model_dir=str(checkpoints.get(request.param)), device="cpu")


@pytest.mark.parametrize(("mode", "eagle"), [("stops", False), ("inline", True)])
def test_shared_prefix_family_matches_cache_off(model, mode, eagle) -> None:
    check_shared_prefix_family(model, mode, eagle, size=5)


def test_multi_turn_extension_hit(model) -> None:
    check_multi_turn_extension(model, first_len=150)


def test_preemption_under_a_small_pool(model) -> None:
    check_preemption(model)


def test_consumer_copy_on_write_matches_cache_off(model) -> None:
    """B resumes inside A's attention and Mamba blocks; the copies keep A's blocks intact."""
    cache = COPY_CACHE
    a = tokens(1, 11)  # resend checkpoint at 10: inside attention block [8, 16), Mamba [0, 16)
    b_prompt = a[:10] + tokens(2, 9)
    rows, cached, paths = [], [], []
    for config in (cache, CacheConfig(**{**cache.__dict__, "enable_prefix_caching": False})):
        runner = TorchRunner(config, model, record_logits=True)
        engine = Engine(config, SchedulerConfig(), model, runner=runner)
        engine.generate([a], SamplingParams(max_tokens=1))
        b = engine.add_request(b_prompt, SamplingParams(max_tokens=1))
        copies = set()
        while b.finish_reason is None:
            out = engine.scheduler.schedule()
            copies |= {(c.path, c.group) for c in out.copies}
            result = runner.execute(out)
            engine.scheduler.update(out, result)
        rows.append(result.logits[b.request_id])
        cached.append(b.num_cached_tokens)
        paths.append(copies)
    assert cached == [10, 0]
    assert {("consumer", "attention"), ("consumer", "mamba")} <= paths[0]
    torch.testing.assert_close(rows[0], rows[1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
@settings(
    max_examples=int(os.environ.get("JUNCTION_TORCH_HF_EXAMPLES", "4")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(trace=traces())
def test_random_traces_match_cache_off(checkpoints, variant, trace) -> None:
    cache, submissions, concurrency, budget = trace
    model = ModelConfig(model_dir=str(checkpoints.get(variant)), device="cpu")
    assert_equivalent(
        cache, SchedulerConfig(max_num_batched_tokens=budget), model, submissions, concurrency
    )
