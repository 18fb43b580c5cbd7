"""Both copy-on-write paths, their step ordering, and the same-step guard."""

from __future__ import annotations

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import BlockCopied, BlockHashesMoved
from engine.request import SamplingParams
from tests.engine.conftest import tokens
from tests.engine.ledger_harness import Harness, Submission


def engine(**overrides) -> Engine:
    # stops mode: a request stops at its resend checkpoint inside its live Mamba block
    base = {
        "block_size": 4,
        "mamba_block_size": 8,
        "prefix_match_unit": 2,
        "num_blocks": 64,
        "junction_checkpoints": False,
        "checkpoint_mode": "stops",
    }
    return Engine(CacheConfig(**{**base, **overrides}), SchedulerConfig(), runner="ledger")


def test_consumer_hit_inside_blocks_writes_private_copies():
    """B shares 6 tokens with A: both groups' hits end inside a block (4 and 8), so B gets a
    private copy of each shared block and the shared blocks keep what they cached."""
    e = engine()
    a = tokens(1, 7)  # resend checkpoint c = 6
    harness = Harness(e)
    harness.run([Submission(a, max_tokens=3)])
    b = e.add_request(a[:6] + [a[6] ^ 1, 5, 5], SamplingParams(max_tokens=3))
    e.step()
    out = e.last_output
    consumer = [c for c in out.copies if c.path == "consumer"]
    assert {c.group for c in consumer} == {"attention", "mamba"}
    assert b.num_cached_tokens == 6
    table = e.scheduler.coordinator.attention.tables[b.request_id]
    for copy in consumer:
        assert copy.position == 6
        assert copy.src != copy.dst
        if copy.group == "attention":
            assert table[-1] == copy.dst and copy.src not in table
    harness.requests.append(b)
    harness._drain(0)  # every later step checks the entries, so the sources stayed intact
    assert (
        b.output_token_ids
        == Engine(
            e.cache_config.__class__(**{**e.cache_config.__dict__, "enable_prefix_caching": False}),
            runner="ledger",
        )
        .generate([b.prompt_token_ids], SamplingParams(max_tokens=3))[0]
        .output_token_ids
    )


def test_copy_endpoints_stay_referenced_until_the_step_ends():
    e = engine()
    a = tokens(2, 7)
    Harness(e).run([Submission(a, max_tokens=1)])
    e.add_request(a[:6] + [9, 9, 9], SamplingParams(max_tokens=1))
    out = e.scheduler.schedule()
    pools = e.scheduler.coordinator.pools
    for copy in out.copies:
        assert pools[copy.group].blocks[copy.src].ref_cnt >= 1
        assert pools[copy.group].blocks[copy.dst].ref_cnt >= 1
    sources = [(c.group, c.src) for c in out.copies]
    e.scheduler.update(out, e.runner.execute(out))
    for group, src in sources:
        assert pools[group].blocks[src].ref_cnt == 0  # released after the step, still cached
        assert pools[group].blocks[src].keys


def test_producer_moves_its_checkpoint_and_the_moved_entry_is_hit_only_next_step():
    """A (8 tokens) stops at c = 6 and registers the state in its live Mamba block; its next
    chunk rewrites that block, so the key moves to a cache-owned block filled by a copy in the
    same step. C, arriving in that step, waits one step and then hits 6 from the moved block."""
    e = engine()
    a = tokens(3, 8)
    first = e.add_request(a, SamplingParams(max_tokens=2))
    e.step()
    assert first.chunks == [(0, 6)]
    assert first.checkpoints == [6]
    sink = e.sink.drain()
    del sink
    c = e.add_request(a[:6] + [1, 2, 3], SamplingParams(max_tokens=1))
    e.step()
    out = e.last_output
    (producer,) = [copy for copy in out.copies if copy.path == "producer"]
    assert producer.group == "mamba" and producer.position == 6
    moved = [ev for ev in e.sink.events if isinstance(ev, BlockHashesMoved)]
    assert moved and moved[0].dst_block_id == producer.dst
    assert c.request_id not in {chunk.request_id for chunk in out.chunks}  # waited
    assert c.num_cached_tokens is None
    e.step()
    assert c.num_cached_tokens == 6
    consumer = [x for x in c.cow_copies if x.group == "mamba"]
    assert consumer[0].src == producer.dst
    e.run_until_done()
    e.check_invariants()


def test_copies_run_in_queue_order_after_zeroing():
    """The runner zeroes new blocks, then copies in order, then runs the forward."""
    e = engine()
    calls: list[str] = []
    runner = e.runner
    zero, copy, forward = runner.zero_blocks, runner.copy_block, runner.forward
    runner.zero_blocks = lambda g, ids: (calls.append("zero"), zero(g, ids))[1]
    runner.copy_block = lambda c: (calls.append(f"copy {c.path}"), copy(c))[1]
    runner.forward = lambda chunks: (calls.append("forward"), forward(chunks))[1]
    a = tokens(4, 8)
    e.add_request(a, SamplingParams(max_tokens=2))
    e.step()
    calls.clear()
    e.step()
    assert calls.index("copy producer") > max(i for i, c in enumerate(calls) if c == "zero")
    assert calls[-1] == "forward"


def test_copy_events_name_both_blocks():
    e = engine()
    a = tokens(5, 7)
    Harness(e).run([Submission(a, max_tokens=1)])
    e.add_request(a[:6] + [0, 0, 0], SamplingParams(max_tokens=1))
    e.step()
    copied = [ev for ev in e.sink.events if isinstance(ev, BlockCopied)]
    assert {(ev.group, ev.path) for ev in copied} >= {
        ("attention", "consumer"),
        ("mamba", "consumer"),
    }
    assert all(ev.src_block_id != ev.dst_block_id for ev in copied)
