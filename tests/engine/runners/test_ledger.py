"""The ledger runner itself: its state digest, its catches, and its bounded bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.runners.ledger import LedgerMismatch, advance
from tests.engine.conftest import tokens

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=300)


@given(TOKENS, st.data())
def test_a_state_is_the_same_whatever_the_chunking(token_ids, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(token_ids)), max_size=5)))
    state, start = (0, 0), 0
    for cut in [*cuts, len(token_ids)]:
        state = advance(state, token_ids[start:cut])
        start = cut
    assert state == advance((0, 0), token_ids)


@given(TOKENS)
def test_a_state_absorbed_one_token_at_a_time_is_the_whole_prefixs(token_ids):
    """A decode step's single token takes a shortcut past the packing: the same state."""
    state = (0, 0)
    for token in token_ids:
        state = advance(state, [token])
    assert state == advance((0, 0), token_ids)


@given(TOKENS, TOKENS)
def test_different_prefixes_have_different_states(a, b):
    if a != b:
        assert advance((0, 0), a) != advance((0, 0), b)


def engine() -> Engine:
    cache = CacheConfig(block_size=4, mamba_block_size=16, prefix_match_unit=2, num_blocks=64)
    return Engine(cache, SchedulerConfig(), runner="ledger")


@pytest.mark.parametrize("group", ["attention", "mamba"])
def test_a_corrupted_block_is_caught_when_it_is_reused(group):
    e = engine()
    shared = tokens(1, 20)
    e.generate([shared + tokens(2, 5)], SamplingParams(max_tokens=1))
    runner = e.runner
    if group == "attention":
        runner.attention[:, 1] += 1  # every attention block: the second slot's token is wrong
    else:
        # every Mamba state's digest is off by one bit
        runner.mamba = [None if s is None else (s[0], s[1] ^ 1) for s in runner.mamba]
    e.add_request(shared + tokens(3, 5), SamplingParams(max_tokens=1))
    with pytest.raises(LedgerMismatch, match=group):
        e.run_until_done()


def test_its_bookkeeping_holds_only_the_requests_of_the_last_step():
    e = engine()
    for seed in range(30):
        e.add_request(tokens(seed, 40), SamplingParams(max_tokens=3))
    e.run_until_done()
    num_last = len(e.last_output.chunks)
    assert len(e.runner._truth) <= num_last and len(e.runner._arrays) <= num_last < 30
