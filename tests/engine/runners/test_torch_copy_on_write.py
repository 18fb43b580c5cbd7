"""Copy-on-write on real tensors: shared blocks stay bit-identical while readers continue."""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.runners.torch_runner import TorchRunner
from tests.engine.conftest import TINY_MODEL, tokens

MODEL = replace(TINY_MODEL, num_attention_layers=2)
# stops mode without junctions: requests stop at their resend checkpoints inside live blocks,
# which is where both copy paths are exercised
CACHE = CacheConfig(
    block_size=8,
    mamba_block_size=16,
    prefix_match_unit=2,
    num_blocks=64,
    num_mamba_blocks=32,
    junction_checkpoints=False,
    checkpoint_mode="stops",
)


def block_tensors(runner: TorchRunner, group: str, block_id: int) -> list[torch.Tensor]:
    return [t[block_id].clone() for t in runner._group_tensors(group)]


def last_logits(cache: CacheConfig, prompts: list[list[int]]) -> list[torch.Tensor]:
    runner = TorchRunner(cache, MODEL, record_logits=True)
    engine = Engine(cache, SchedulerConfig(), MODEL, runner=runner)
    rows = []
    for prompt in prompts:
        request = engine.add_request(prompt, SamplingParams(max_tokens=1))
        while request.finish_reason is None:
            engine.step()
        rows.append(engine.last_result.logits[request.request_id])
    return rows


def test_consumer_copy_leaves_the_shared_blocks_bit_identical():
    """B resumes inside A's attention block and A's Mamba block. If B wrote into the shared
    blocks they would change; if the copy ran after the forward, B would read zeros and its
    logits would leave the cache-off ones."""
    runner = TorchRunner(CACHE, MODEL, record_logits=True)
    engine = Engine(CACHE, SchedulerConfig(), MODEL, runner=runner)
    a = tokens(1, 11)  # resend checkpoint at 10: inside attention block [8, 16) and Mamba [0, 16)
    engine.generate([a], SamplingParams(max_tokens=1))
    b_prompt = a[:10] + tokens(2, 9)
    b = engine.add_request(b_prompt, SamplingParams(max_tokens=1))
    out = engine.scheduler.schedule()
    consumer = {c.group: c for c in out.copies if c.path == "consumer"}
    assert consumer.keys() == {"attention", "mamba"}
    before = {g: block_tensors(runner, g, c.src) for g, c in consumer.items()}
    result = runner.execute(out)
    engine.scheduler.update(out, result)
    engine.run_until_done()
    for group, copy in consumer.items():
        after = block_tensors(runner, group, copy.src)
        for x, y in zip(before[group], after, strict=True):
            assert torch.equal(x, y), f"shared {group} block {copy.src} changed"
    assert b.num_cached_tokens == 10
    (reference,) = last_logits(
        CacheConfig(**{**CACHE.__dict__, "enable_prefix_caching": False}), [b_prompt]
    )
    torch.testing.assert_close(
        engine.last_result.logits[b.request_id], reference, atol=1e-4, rtol=0
    )


def test_producer_move_keeps_the_checkpoint_state():
    """A stops at its resend checkpoint 10 inside its live Mamba block, then keeps writing it;
    the checkpoint moves to a cache-owned block whose state C then resumes from."""
    a = tokens(3, 11)
    c_prompt = a[:10] + tokens(4, 5)
    on = last_logits(CACHE, [a, c_prompt])
    off = last_logits(
        CacheConfig(**{**CACHE.__dict__, "enable_prefix_caching": False}), [a, c_prompt]
    )
    torch.testing.assert_close(on[1], off[1], atol=1e-4, rtol=0)
    runner = TorchRunner(CACHE, MODEL)
    engine = Engine(CACHE, SchedulerConfig(), MODEL, runner=runner)
    first = engine.add_request(a, SamplingParams(max_tokens=3))
    engine.run_until_done()
    assert any(c.path == "producer" for c in first.cow_copies)
