"""Scheduler behaviour through a whole engine: split, resume, preemption, decode, modes."""

from __future__ import annotations

import pytest

from engine.cache.entry import CheckpointReason
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from tests.engine.conftest import tokens
from tests.engine.ledger_harness import Harness, Submission


def make(runner: str = "ledger", budget: int = 8192, **cache) -> Engine:
    # the worked examples of docs/rules.md section 6's split are stops-mode examples, without
    # junctions
    base = {
        "block_size": 32,
        "mamba_block_size": 512,
        "prefix_match_unit": 32,
        "num_blocks": 2048,
        "junction_checkpoints": False,
        "checkpoint_mode": "stops",
    }
    return Engine(
        CacheConfig(**{**base, **cache}),
        SchedulerConfig(max_num_batched_tokens=budget),
        runner=runner,
    )


def test_worked_split_8192_1536_256_16():
    e = make()
    request = e.add_request(tokens(1, 10000), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert [end - start for start, end in request.chunks] == [8192, 1536, 256, 16]
    assert request.chunk_stop_reasons == ["budget", "block_boundary", "resend", "end"]
    assert request.checkpoints == [8192, 9728, 9984]


def test_resume_from_9984_on_a_12000_token_prompt():
    e = make(budget=1000)
    prefix = tokens(2, 10000)
    Harness(e).run([Submission(prefix)])
    longer = e.add_request(prefix + tokens(3, 2000), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert longer.num_cached_tokens == 9984  # the resend checkpoint (no extension: e == c)
    assert longer.chunks[:3] == [(9984, 10240), (10240, 10752), (10752, 11264)]


def test_preemption_when_blocks_run_out_recomputes_and_keeps_outputs():
    config = {"block_size": 4, "mamba_block_size": 8, "prefix_match_unit": 2, "num_blocks": 20}
    prompts = [tokens(s, 30) for s in range(4)]
    e = make(budget=64, **config)
    harness = Harness(e, concurrency=4)
    requests = harness.run([Submission(p, max_tokens=20) for p in prompts])
    assert sum(r.num_preemptions for r in requests) > 0
    reference = make(budget=64, enable_prefix_caching=False, **{**config, "num_blocks": 400})
    expected = reference.generate(prompts, SamplingParams(max_tokens=20))
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in expected]


def test_decode_appends_one_token_a_step():
    e = make()
    request = e.add_request(tokens(4, 100), SamplingParams(max_tokens=5))
    steps = 0
    while e.has_unfinished():
        e.step()
        steps += 1
    assert len(request.output_token_ids) == 5
    assert steps == len(request.chunks) + 4  # the last prefill chunk samples the first token
    assert request.finish_reason == "length"


@pytest.mark.parametrize("eagle", [False, True])
def test_inline_mode_matches_stops_outputs_with_no_fewer_hits(eagle):
    shared = tokens(5, 700)
    prompts = [shared + tokens(10 + i, 300 + 37 * i) for i in range(4)] + [shared[:650]]
    results = {}
    for mode in ("stops", "inline"):
        e = make(checkpoint_mode=mode, eagle=eagle, junction_checkpoints=True, mamba_block_size=256)
        harness = Harness(e)
        requests = harness.run([Submission(p, max_tokens=4) for p in prompts])
        results[mode] = requests
    stops, inline = results["stops"], results["inline"]
    assert [r.output_token_ids for r in stops] == [r.output_token_ids for r in inline]
    for s, i in zip(stops, inline, strict=True):
        assert i.num_cached_tokens >= s.num_cached_tokens
        assert len(i.chunks) <= len(s.chunks)


def test_a_request_too_large_for_the_pool_is_refused_with_the_numbers():
    e = make(num_blocks=10)
    with pytest.raises(ValueError, match=r"attention blocks of 32 tokens.*10 unpinned of 10"):
        e.add_request(tokens(6, 1000), SamplingParams(max_tokens=1))


def test_abort_frees_the_request_blocks():
    e = make()
    request = e.add_request(tokens(7, 3000), SamplingParams(max_tokens=50))
    e.step()
    e.abort(request.request_id)
    pools = e.scheduler.coordinator.pools
    assert all(pool.num_free == pool.num_blocks for pool in pools.values())
    assert request.finish_reason == "abort"
    e.check_invariants()


def test_junction_checkpoint_is_the_attention_match_at_unit_granularity():
    """Attention blocks of 64 and unit 16: a 560-token shared prompt gives j = 560."""
    e = make(block_size=64, prefix_match_unit=16, junction_checkpoints=True)
    system = tokens(8, 560)
    harness = Harness(e)
    a, b, c = harness.run([Submission(system + tokens(20 + i, 1386)) for i in range(3)])
    assert b.hit_tokens_by_group["attention"] == 560
    assert 560 in b.checkpoints
    assert c.num_cached_tokens == 560


def test_a_request_that_cannot_fit_beside_pins_finishes_with_capacity():
    """Pins took blocks after the request was accepted: it is refused, not retried forever."""
    e = make(
        block_size=16, prefix_match_unit=16, num_blocks=40, mamba_block_size=64, pin_max_share=0.5
    )
    request = e.add_request(tokens(11, 600), SamplingParams(max_tokens=1))  # 38 + 1 blocks
    pin = e.pin("big", tokens(12, 300))
    e.scheduler.waiting.rotate(1)  # the pin materializes first
    finished = e.run_until_done(max_steps=50)
    assert pin.state.value == "materialized"
    assert request.finish_reason == "capacity"
    assert request in finished


@pytest.mark.parametrize("mode", ["stops", "inline"])
def test_a_junction_keeps_its_block_floor_for_prompts_that_diverge_below_it(mode):
    """doc, then X sharing 4864 tokens with it (junction at 4864), then Y diverging at 4700:
    Y finds the state at floor(4864 / 512) * 512 = 4608 that X kept beside its junction."""
    e = make(
        block_size=16,
        prefix_match_unit=16,
        junction_checkpoints=True,
        checkpoint_mode=mode,
        checkpoint_interval=0,  # doc's interval states would give Y 4672
    )
    shared = tokens(1, 4864)
    one = SamplingParams(max_tokens=1)
    e.generate([shared + tokens(9, 1236)], one)
    (x,) = e.generate([shared + tokens(3, 500)], one)
    assert x.hit_tokens_by_group["attention"] == 4864
    if mode == "stops":  # inline, doc already wrote every block boundary's state
        assert x.num_cached_tokens == 0 and 4608 in x.checkpoints
    (y,) = e.generate([shared[:4700] + tokens(4, 300)], one)
    assert y.num_cached_tokens == 4608


@pytest.mark.parametrize("caching", [False, True])
def test_a_passed_mamba_slot_that_holds_no_state_goes_back_to_the_pool(caching):
    """A chunk resumes from the slot holding its start, so a slot the request computed past is
    never read again: with nothing registered (prefix caching off) it goes back to the pool
    after the step and the request holds one slot, its live state; a slot holding a state it
    registered stays in its table."""
    e = make(budget=600, enable_prefix_caching=caching)
    request = e.add_request(tokens(8, 2000), SamplingParams(max_tokens=3))
    mamba = e.scheduler.coordinator.mamba
    while e.has_unfinished():
        e.step()
        e.check_invariants()
        table = mamba.tables.get(request.request_id)
        if table is None:
            break
        live = mamba.slot_index(request.num_computed_tokens)
        assert table[live] is not None
        passed = [block_id for block_id in table[:live] if block_id is not None]
        in_use = sum(1 for block in mamba.pool.blocks if block.ref_cnt)
        if caching:  # the states at 512, 1024 and 1536 stay, each in its slot
            assert len(passed) == live
            assert all(mamba.pool.blocks[block_id].keys for block_id in passed)
        else:
            assert passed == []
        assert in_use == len(passed) + 1
    assert request.num_computed_tokens > 1536


def test_a_passed_mamba_slot_holding_a_tail_state_goes_back_but_the_state_stays_cached():
    """A 1024-token prompt ends on a slot's end: its `extension` state at 1024 is in slot 1,
    which the first decode step passes. A tail state is read by a later request that extends
    or resends the prompt, never by this one, so the slot goes back to the pool then, its state
    still cached (a free block a hit may take); the `block` state at 512 stays in the
    request's table until it ends."""
    e = make(budget=2048, checkpoint_mode="inline")
    prompt = tokens(9, 1024)
    request = e.add_request(prompt, SamplingParams(max_tokens=4))
    mamba = e.scheduler.coordinator.mamba
    e.step()  # the whole prefill: the states at 512 and 1024
    table = mamba.tables[request.request_id]
    head, tail = table
    keys = mamba.pool.blocks[tail].keys
    assert [mamba.pool.entries[key].reason for key in keys] == [CheckpointReason.EXTENSION]
    e.step()  # the first decode step computes in slot 2
    e.check_invariants()
    assert table[1] is None and table[2] is not None
    assert mamba.pool.blocks[tail].ref_cnt == 0 and mamba.pool.blocks[tail].keys == keys
    assert mamba.pool.blocks[head].ref_cnt == 1
    e.run_until_done()
    turn = prompt + request.output_token_ids + tokens(10, 40)
    longer = e.add_request(turn, SamplingParams(max_tokens=1))
    e.run_until_done()
    assert longer.num_cached_tokens >= 1024  # the next turn resumes from the tail or past it
