"""Intake: the most blocks a request may hold at once, against what the pools have unpinned."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import ATTENTION, MAMBA
from engine.request import SamplingParams
from engine.scheduling.capacity import ATTENTION_EXTRA_BLOCKS, MAMBA_EXTRA_BLOCKS, blocks_needed
from tests.engine.conftest import tokens


def test_blocks_needed_is_a_slot_per_block_plus_the_extras_and_one_per_pin():
    config = CacheConfig(block_size=16, mamba_block_size=64, prefix_match_unit=16)
    assert (ATTENTION_EXTRA_BLOCKS, MAMBA_EXTRA_BLOCKS) == (1, 4)
    assert blocks_needed(100, config, num_pins=0) == {ATTENTION: 7 + 1, MAMBA: 2 + 4}
    assert blocks_needed(128, config, num_pins=3) == {ATTENTION: 8 + 1, MAMBA: 2 + 4 + 3}


@pytest.mark.parametrize("num_mamba_blocks", [4, 5])
def test_a_request_is_refused_at_intake_only_when_the_mamba_pool_is_below_its_need(
    num_mamba_blocks: int,
):
    config = CacheConfig(
        block_size=16, mamba_block_size=64, prefix_match_unit=16, num_mamba_blocks=num_mamba_blocks
    )
    e = Engine(config, SchedulerConfig(), runner="ledger")
    prompt = tokens(1, 60)  # 60 + 1 tokens: one Mamba slot, so a need of 1 + 4
    if num_mamba_blocks < 5:
        with pytest.raises(ValueError, match="may need 5 mamba blocks"):
            e.add_request(prompt, SamplingParams(max_tokens=1))
        return
    request = e.add_request(prompt, SamplingParams(max_tokens=1))
    e.run_until_done()
    assert request.finish_reason == "length"


def test_one_step_can_hold_every_mamba_extra_block_a_copy_and_c_e_j_inline():
    """The four extra Mamba blocks are reached together: a consumer copy's shared source, and
    cache-owned blocks for the resend, extension (EAGLE keeps both inside the prompt) and
    junction checkpoints, all in the admission chunk beside the request's one table slot."""
    config = CacheConfig(
        block_size=16,
        mamba_block_size=1024,
        prefix_match_unit=16,
        num_blocks=400,
        eagle=True,
        checkpoint_interval=0,
    )
    e = Engine(config, SchedulerConfig(), runner="ledger")
    family = tokens(1, 1000)
    for prompt in (family[:209], family[:700]):  # checkpoints at 208, then 688 (and 672)
        e.add_request(prompt, SamplingParams(max_tokens=1))
        e.run_until_done()
    request = e.add_request(family[:600] + tokens(2, 105), SamplingParams(max_tokens=1))
    out = e.scheduler.schedule()
    assert request.hit_tokens_by_group == {ATTENTION: 576, MAMBA: 208}
    assert sorted(request.targets) == [576, 688, 704]  # j, c, e: none on a block boundary
    assert [c.path for c in request.cow_copies] == ["consumer"]
    pool = e.scheduler.coordinator.mamba.pool
    held = sum(1 for block in pool.blocks if block.ref_cnt)
    total = request.num_prompt_tokens + request.sampling.max_tokens
    assert held == blocks_needed(total, config, num_pins=0)[MAMBA] == 1 + MAMBA_EXTRA_BLOCKS
    e.scheduler.update(out, e.runner.execute(out))
    e.run_until_done()
    e.check_invariants()
