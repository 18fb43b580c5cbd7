"""The bound under memory: never above the oracle, equal to it in the working set, monotone in
each budget, nothing without sharing, and Belady's choice on a hand-made trace; the same for
the order-blind reference, and its own choice."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.traces.trace import parse_line
from workloads import oracle
from workloads.bound import Budget, bound, in_flight_need, working_set

UNIT, BA = 2, 4


def trace(prompts: list[list[int]], max_tokens: int = 1) -> list:
    return [
        parse_line(json.dumps({"id": f"r{n}", "prompt_token_ids": p, "max_tokens": max_tokens}), n)
        for n, p in enumerate(prompts, start=1)
    ]


def bound_hits(
    items, budget: Budget, concurrency: int = 1, eagle: bool = False, order_blind: bool = False
) -> list[int]:
    result = bound(items, UNIT, BA, budget, concurrency, eagle, order_blind=order_blind)
    return [h.num_bound_tokens for h in result.hits]


# prompts drawn from a few families: a family's prompts share a random-length prefix
family_prompts = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(2, 20), st.integers(0, 5)),
    min_size=1,
    max_size=14,
).map(
    lambda rows: [
        [family * 100 + t for t in range(shared)] + [1000 + 37 * n + t for t in range(tail)]
        if shared + tail
        else [family]
        for n, (family, shared, tail, _) in enumerate(rows)
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    family_prompts,
    st.integers(1, 40),
    st.integers(1, 12),
    st.integers(1, 4),
    st.booleans(),
    st.booleans(),
)
def test_the_bound_never_exceeds_the_oracle_and_reaches_it_in_the_working_set(
    prompts, num_blocks, num_states, concurrency, eagle, order_blind
):
    items = trace(prompts)
    best = [h.num_oracle_tokens for h in oracle(items, UNIT, eagle).hits]
    squeezed = bound_hits(items, Budget(num_blocks, num_states), concurrency, eagle, order_blind)
    assert all(b <= o for b, o in zip(squeezed, best, strict=True))
    whole = working_set(items, UNIT, BA, concurrency, eagle)
    assert bound_hits(items, whole, concurrency, eagle, order_blind) == best


@settings(max_examples=60, deadline=None)
@given(family_prompts, st.integers(1, 30), st.integers(1, 10), st.integers(1, 3), st.booleans())
def test_the_bound_grows_with_each_budget(
    prompts, num_blocks, num_states, concurrency, order_blind
):
    items = trace(prompts)

    def total(budget: Budget) -> int:
        return sum(bound_hits(items, budget, concurrency, order_blind=order_blind))

    base = total(Budget(num_blocks, num_states))
    assert total(Budget(num_blocks + 3, num_states)) >= base
    assert total(Budget(num_blocks, num_states + 2)) >= base


def test_a_trace_without_sharing_has_a_bound_of_zero():
    items = trace([[n * 50 + t for t in range(20)] for n in range(6)])
    assert bound_hits(items, Budget(100, 100)) == [0] * 6


def test_belady_keeps_the_state_read_sooner():
    a, b = list(range(10)), list(range(100, 110))
    # one cached state slot: after a and b, a's resume (read next) is kept, b's given up
    items = trace([a, b, a, b])
    need = in_flight_need(items, UNIT, BA)
    budget = Budget(100, need.num_mamba_blocks + 1)
    assert bound_hits(items, budget) == [0, 0, 8, 0]
    assert bound_hits(items, Budget(100, need.num_mamba_blocks + 2)) == [0, 0, 8, 8]


def test_the_order_blind_reference_keeps_the_state_read_more_often_else_the_last_read():
    a, b = list(range(10)), list(range(100, 110))
    need = in_flight_need(trace([a]), UNIT, BA)
    budget = Budget(100, need.num_mamba_blocks + 1)
    # one cached state slot: a and b are each read once more, so the last written (b) stays,
    # where Belady keeps a, read sooner
    assert bound_hits(trace([a, b, a, b]), budget, order_blind=True) == [0, 0, 0, 8]
    # b is read twice more, a once: b stays, though a is read first
    assert bound_hits(trace([b, a, a, b, b]), budget, order_blind=True) == [0, 0, 0, 8, 8]
    assert bound_hits(trace([b, a, a, b, b]), budget) == [0, 0, 8, 0, 8]


def test_a_state_needs_its_blocks_too():
    a = list(range(10))
    # the state is there but the attention pool keeps no block: nothing hits
    items = trace([a, a])
    assert bound_hits(items, Budget(0, 10)) == [0, 0]
    assert bound_hits(items, Budget(3, 10)) == [0, 8]


def test_in_flight_blocks_are_shared_within_the_window():
    a = list(range(10))
    items = trace([a, a, a], max_tokens=1)
    # three blocks of `a` (the last holds units 8 only), shared by the window: 3 blocks
    assert in_flight_need(items, UNIT, BA, concurrency=3) == Budget(3, 3)


def test_in_flight_requests_past_their_first_chunk_hold_one_state_slot():
    """`Bm` of 8: `a` (16 tokens and one output, no hit) writes three slots in its first chunk,
    then holds one, its live state, as the engine hands back the passed slots that hold no
    state. With 5 slots and 3 in flight, `a`, `b` and `d` hold 3 when `d` comes, so the state
    `a` wrote at 8 stays for `e`; counting `a` at three slots all the while gives it up."""
    a = list(range(16))
    b, d = [500, 501, 502, 503], [600, 601, 602, 603]
    e = a[:8] + list(range(700, 708))
    result = bound(trace([a, b, d, e]), UNIT, BA, Budget(100, 5), 3, mamba_block_size=8)
    assert [h.num_bound_tokens for h in result.hits] == [0, 0, 0, 8]
    # the window still holds `a` at its first chunk's three slots while it is admitted
    alone = bound(trace([a, e]), UNIT, BA, Budget(100, 3), 2, mamba_block_size=8)
    assert [h.num_bound_tokens for h in alone.hits] == [0, 0]


def test_the_window_keeps_every_request_whose_live_slots_exactly_fit():
    """A worked case of the window (`window_start`), each request one live slot (no `Bm`),
    three in flight, `a` (10 tokens) resumed by the last request at its state at 8:

    - 3 slots: at `d` the window `a, b, d` holds 1 + 2 = 3 live slots, exactly the pool, so
      all three stay in flight and the room for cached states is 3 - 3 = 0: `a`'s state is
      evicted. At the second `a` the window `b, d, a` again holds 3, and finds no state: 0.
    - 4 slots: the same windows hold 3, leaving 1 slot in which Belady keeps `a`'s state
      (read next; `b` and `d` write none): the second `a` hits 8.

    A window that let a request go when its live slots only equal the pool would, at 3 slots,
    run `b, d` at `d` and `d, a` at the second `a`, keep `a`'s state in the spare slot and
    hit 8."""
    a = list(range(10))
    b, d = list(range(100, 110)), list(range(200, 210))
    items = trace([a, b, d, a])
    assert bound_hits(items, Budget(100, 3), concurrency=3) == [0, 0, 0, 0]
    assert bound_hits(items, Budget(100, 4), concurrency=3) == [0, 0, 0, 8]
