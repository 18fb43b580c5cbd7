"""Chunk stops and checkpoint positions: the rules and worked numbers of docs/rules.md sections
5-6."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from engine.cache.entry import CheckpointReason
from engine.scheduling.chunking import (
    Chunk,
    StopReason,
    checkpoint_targets,
    extension_checkpoint,
    plan_chunk,
    resend_checkpoint,
    state_positions,
)

BM = 512
UNIT = 32

RESEND = CheckpointReason.RESEND
EXTENSION = CheckpointReason.EXTENSION
JUNCTION = CheckpointReason.JUNCTION
PIN = CheckpointReason.PIN
BLOCK = CheckpointReason.BLOCK


@pytest.fixture
def prefill():
    """Run a whole prefill: plan a chunk, feed its end back as the next start, until `P`."""

    def run(
        num_tokens: int,
        budget: int | Iterable[int],
        *,
        start: int = 0,
        unit: int = UNIT,
        scheduler_block: int = BM,
        chunk_limit: int | None = None,
        eagle: bool = False,
        partial_hits: bool = True,
        junction: int | None = None,
        pins: Iterable[int] = (),
        stops: bool = True,
    ) -> list[Chunk]:
        budgets = itertools.repeat(budget) if isinstance(budget, int) else iter(budget)
        targets = checkpoint_targets(
            num_tokens, unit, scheduler_block, eagle, partial_hits, junction, pins
        )
        chunks: list[Chunk] = []
        while start < num_tokens:
            num_new = next(budgets)
            limit = chunk_limit if chunk_limit is not None else num_new
            chunk = plan_chunk(
                start, num_new, num_tokens, scheduler_block, limit, eagle, targets, stops
            )
            assert chunk is not None, f"no progress from {start}"
            assert start < chunk.end <= num_tokens
            chunks.append(chunk)
            start = chunk.end
            assert len(chunks) < 1000
        return chunks

    return run


def _ends(chunks: list[Chunk]) -> list[int]:
    return [chunk.end for chunk in chunks]


def _written_states(chunks: list[Chunk], targets: dict, inline: bool) -> set[int]:
    starts = [0, *_ends(chunks)]
    return {
        position
        for start, chunk in zip(starts, chunks, strict=False)
        for position in state_positions(start, chunk.end, BM, targets, inline=inline)
    }


# ------------------------------------------------------------------ worked numbers


def test_worked_example_10000_tokens_budget_8192(prefill) -> None:
    chunks = prefill(10000, 8192)
    assert _ends(chunks) == [8192, 9728, 9984, 10000]
    sizes = [end - start for start, end in itertools.pairwise([0, *_ends(chunks)])]
    assert sizes == [8192, 1536, 256, 16]
    assert [chunk.stop_reason for chunk in chunks] == [
        StopReason.BUDGET,
        StopReason.BLOCK,
        StopReason.RESEND,
        StopReason.END,
    ]


def test_worked_resume_from_hit_inside_a_mamba_block(prefill) -> None:
    first = plan_chunk(
        9984, 8192, 12000, BM, 8192, False, checkpoint_targets(12000, UNIT, BM, False, True), True
    )
    assert first == Chunk(10240, StopReason.BLOCK)
    assert first.end - 9984 == 256
    chunks = prefill(12000, 1000, start=10240)
    assert _ends(chunks)[:3] == [10752, 11264, 11776]
    assert [c.stop_reason for c in chunks[:2]] == [StopReason.BUDGET, StopReason.BUDGET]


def test_resume_from_hit_runs_to_the_prompt_end(prefill) -> None:
    chunks = prefill(12000, [8192, *[1000] * 10], start=9984)
    # c = 11968 and e = 12000 for a 12000-token prompt; 11776 is its last block boundary
    assert _ends(chunks) == [10240, 10752, 11264, 11776, 11968, 12000]
    assert [c.stop_reason for c in chunks] == [
        StopReason.BLOCK,
        StopReason.BUDGET,
        StopReason.BUDGET,
        StopReason.BLOCK,
        StopReason.RESEND,
        StopReason.END,
    ]


# ------------------------------------------------------------------ checkpoint formulas


@pytest.mark.parametrize(
    ("num_tokens", "unit", "eagle", "resend", "extension"),
    [
        (7296, 128, True, 7168, 7296),  # P a multiple of U: floor(P/U)*U - U
        (7296, 128, False, 7168, 7296),  # floor((P-1)/U)*U
        (7040, 128, True, 6912, 7040),
        (7040, 128, False, 6912, 7040),
        (7000, 128, False, 6912, 6912),
        (7000, 128, True, 6784, 6912),
        (10000, 32, False, 9984, 9984),
        (10000, 32, True, 9952, 9984),
        (100, 128, True, 0, 0),  # clamped at 0
        (100, 128, False, 0, 0),
        (128, 128, True, 0, 128),
        (129, 128, False, 128, 128),
        (1, 32, False, 0, 0),
    ],
)
def test_resend_and_extension_formulas(
    num_tokens: int, unit: int, eagle: bool, resend: int, extension: int
) -> None:
    assert resend_checkpoint(num_tokens, unit, eagle) == resend
    assert extension_checkpoint(num_tokens, unit) == extension


@pytest.mark.parametrize("num_tokens", [1, 31, 32, 33, 63, 64, 1000, 7296, 10000])
@pytest.mark.parametrize("eagle", [False, True])
def test_exact_resend_hits_c(num_tokens: int, eagle: bool) -> None:
    """`c` is the largest unit boundary an exact resend may hit: at most `P - 1`, and one unit
    further back with EAGLE (which reads one unit beyond the hit)."""
    c = resend_checkpoint(num_tokens, UNIT, eagle)
    assert c % UNIT == 0 and c >= 0
    if eagle:
        assert c == max(num_tokens // UNIT * UNIT - UNIT, 0)
        assert c + UNIT <= num_tokens or c == 0
    else:
        assert c <= num_tokens - 1 < c + UNIT


def test_targets_with_eagle_keep_both_c_and_e() -> None:
    targets = checkpoint_targets(7296, 128, BM, eagle=True, partial_hits=True)
    assert targets == {7168: RESEND, 7296: EXTENSION}


def test_targets_omit_e_when_equal_to_c() -> None:
    targets = checkpoint_targets(10000, UNIT, BM, eagle=False, partial_hits=True)
    assert targets == {9984: RESEND}


def test_targets_include_junction_and_pins_with_partial_hits_on() -> None:
    targets = checkpoint_targets(
        10000, UNIT, BM, eagle=False, partial_hits=True, junction=576, pins=[1024, 2048]
    )
    # the junction brings its block floor (512) with it
    assert targets == {9984: RESEND, 512: JUNCTION, 576: JUNCTION, 1024: PIN, 2048: PIN}


def test_targets_with_partial_hits_on_floor_junction_and_pins_to_the_unit() -> None:
    targets = checkpoint_targets(10000, UNIT, BM, False, True, junction=560, pins=[1000])
    assert targets == {9984: RESEND, 512: JUNCTION, 544: JUNCTION, 992: PIN}


def test_targets_with_partial_hits_off_keep_only_junction_and_pins_floored_to_s() -> None:
    targets = checkpoint_targets(
        10000, UNIT, 1536, eagle=False, partial_hits=False, junction=2000, pins=[3100, 5000]
    )
    assert targets == {1536: JUNCTION, 3072: PIN, 4608: PIN}


def test_targets_with_partial_hits_off_drop_a_junction_below_one_block() -> None:
    targets = checkpoint_targets(10000, UNIT, BM, eagle=False, partial_hits=False, junction=300)
    assert targets == {}


def test_position_claimed_twice_keeps_longest_retained_reason() -> None:
    targets = checkpoint_targets(10000, UNIT, BM, False, True, junction=9984, pins=[576])
    assert targets[9984] is JUNCTION
    targets = checkpoint_targets(10000, UNIT, BM, False, True, junction=576, pins=[576])
    assert targets[576] is PIN


def test_targets_outside_the_prompt_are_dropped() -> None:
    targets = checkpoint_targets(1024, UNIT, BM, False, True, junction=0, pins=[2048, 1024])
    assert 0 not in targets
    assert 2048 not in targets
    assert targets[1024] is PIN  # a pin at the prompt end lies inside it


# ------------------------------------------------------------------ plan_chunk rule 1


def test_budget_limited_end_is_floored_to_s() -> None:
    chunk = plan_chunk(0, 1000, 10000, BM, 8192, False, {}, True)
    assert chunk == Chunk(512, StopReason.BUDGET)


def test_budget_limited_end_is_floored_to_lcm_when_partial_hits_off(prefill) -> None:
    chunk = plan_chunk(0, 4000, 10000, 1536, 8192, False, {}, True)
    assert chunk == Chunk(3072, StopReason.BUDGET)
    chunks = prefill(10000, 8192, scheduler_block=1536, partial_hits=False, junction=2000)
    # the junction stop is floored to S; c = 9984 is no stop with partial hits off
    assert _ends(chunks) == [1536, 9216, 10000]
    assert [c.stop_reason for c in chunks] == [
        StopReason.JUNCTION,
        StopReason.BUDGET,
        StopReason.END,
    ]


def test_end_at_prompt_end_is_not_floored() -> None:
    assert plan_chunk(9984, 16, 10000, BM, 8192, False, {}, True) == Chunk(10000, StopReason.END)
    assert plan_chunk(9984, 500, 10000, BM, 8192, False, {}, True) == Chunk(10000, StopReason.END)


@pytest.mark.parametrize(("start", "num_new"), [(0, 300), (600, 300), (9984, 100)])
def test_no_progress_schedules_nothing_when_s_fits_the_chunk_limit(
    start: int, num_new: int
) -> None:
    assert plan_chunk(start, num_new, 12000, BM, 8192, False, {}, True) is None
    assert plan_chunk(start, num_new, 12000, BM, BM, False, {}, False) is None


@pytest.mark.parametrize(("start", "num_new"), [(0, 300), (600, 300), (9984, 100)])
def test_no_progress_keeps_unaligned_end_when_s_exceeds_the_chunk_limit(
    start: int, num_new: int
) -> None:
    chunk = plan_chunk(start, num_new, 12000, BM, 300, False, {}, True)
    assert chunk == Chunk(start + num_new, StopReason.BUDGET)


def test_long_prefill_threshold_below_s_still_makes_progress(prefill) -> None:
    chunks = prefill(2000, 256, chunk_limit=256)
    assert _ends(chunks)[:3] == [256, 512, 768]
    assert chunks[-1].end == 2000


# ------------------------------------------------------------------ plan_chunk rule 2


def test_eagle_last_block_is_one_s_earlier(prefill) -> None:
    targets = checkpoint_targets(10000, UNIT, BM, True, True)
    assert plan_chunk(8192, 8192, 10000, BM, 8192, True, targets, True) == Chunk(
        9216, StopReason.BLOCK
    )
    chunks = prefill(10000, 8192, eagle=True)
    assert _ends(chunks) == [8192, 9216, 9952, 9984, 10000]
    assert [c.stop_reason for c in chunks] == [
        StopReason.BUDGET,
        StopReason.BLOCK,
        StopReason.RESEND,
        StopReason.EXTENSION,
        StopReason.END,
    ]


def test_last_block_equal_to_prompt_end_is_no_stop() -> None:
    # P a multiple of S: the last block boundary is P itself, not strictly inside the chunk
    chunk = plan_chunk(0, 8192, 1024, BM, 8192, False, {}, True)
    assert chunk == Chunk(1024, StopReason.END)


def test_stops_at_junction_then_next_block_then_pin(prefill) -> None:
    chunks = prefill(10000, 8192, junction=576, pins=[2048])
    assert _ends(chunks)[:4] == [512, 576, 1024, 2048]
    assert [c.stop_reason for c in chunks[:4]] == [
        StopReason.JUNCTION,  # floor(576 / 512) * 512: a prompt diverging below 576 hits it
        StopReason.JUNCTION,
        StopReason.BLOCK,
        StopReason.PIN,
    ]


def test_smallest_stop_inside_the_chunk_wins() -> None:
    targets = {3000: PIN, 700: JUNCTION, 5000: RESEND}
    assert plan_chunk(0, 8192, 10000, BM, 8192, False, targets, True) == Chunk(
        700, StopReason.JUNCTION
    )
    assert plan_chunk(700, 8192, 10000, BM, 8192, False, targets, True) == Chunk(
        1024, StopReason.BLOCK
    )


def test_stop_must_lie_strictly_inside_the_chunk() -> None:
    targets = {512: JUNCTION}
    assert plan_chunk(512, 8192, 10000, BM, 8192, False, targets, True).end != 512
    assert plan_chunk(0, 512, 10000, BM, 8192, False, targets, True).end == 512


# ------------------------------------------------------------------ inline mode


def test_inline_mode_ends_only_at_budget_or_prompt_end(prefill) -> None:
    chunks = prefill(10000, 8192, stops=False, junction=576, pins=[2048])
    assert _ends(chunks) == [8192, 10000]
    assert [c.stop_reason for c in chunks] == [StopReason.BUDGET, StopReason.END]


def test_inline_mode_resumed_from_a_hit_ignores_the_block_stop() -> None:
    targets = checkpoint_targets(12000, UNIT, BM, False, True)
    assert plan_chunk(9984, 8192, 12000, BM, 8192, False, targets, False) == Chunk(
        12000, StopReason.END
    )


def test_inline_mode_still_floors_budget_limited_ends() -> None:
    assert plan_chunk(0, 1000, 10000, BM, 8192, False, {}, False) == Chunk(512, StopReason.BUDGET)


def test_state_positions_stops_mode_is_chunk_end_only() -> None:
    targets = {576: JUNCTION, 9984: RESEND}
    assert state_positions(0, 8192, BM, targets, inline=False) == [8192]
    assert state_positions(9728, 9984, BM, targets, inline=False) == [9984]


def test_state_positions_inline_mode_has_boundaries_and_targets() -> None:
    targets = {576: JUNCTION, 9984: RESEND}
    assert state_positions(0, 2048, BM, targets, inline=True) == [512, 576, 1024, 1536, 2048]
    assert state_positions(8192, 10000, BM, targets, inline=True) == [
        8704,
        9216,
        9728,
        9984,
        10000,
    ]


def test_state_positions_inline_from_inside_a_block() -> None:
    targets = checkpoint_targets(12000, UNIT, BM, False, True)  # 11968 and 12000
    assert state_positions(9984, 12000, BM, targets, inline=True) == [
        10240,
        10752,
        11264,
        11776,
        11968,
        12000,
    ]


def test_state_positions_inline_do_not_repeat_the_end() -> None:
    targets = {1024: PIN}
    assert state_positions(0, 1024, BM, targets, inline=True) == [512, 1024]


@pytest.mark.parametrize(
    ("num_tokens", "budget", "eagle", "junction", "pins"),
    [
        (10000, 8192, False, None, ()),
        (10000, 8192, True, 576, (2048,)),
        (12000, 1000, False, 3000, ()),
        (5000, 700, True, None, (1600, 4160)),
        (777, 8192, False, 224, ()),
    ],
)
def test_inline_writes_every_state_that_stops_mode_writes(
    prefill, num_tokens: int, budget: int, eagle: bool, junction: int | None, pins: tuple
) -> None:
    targets = checkpoint_targets(num_tokens, UNIT, BM, eagle, True, junction, pins)
    kwargs = {"eagle": eagle, "junction": junction, "pins": pins}
    stops = prefill(num_tokens, budget, **kwargs)
    inline = prefill(num_tokens, budget, stops=False, **kwargs)
    stop_states = _written_states(stops, targets, inline=False)
    inline_states = _written_states(inline, targets, inline=True)
    assert stop_states <= inline_states
    assert set(targets) <= inline_states
    assert len(inline) <= len(stops)


# ------------------------------------------------------------------ message checkpoints
MESSAGE = CheckpointReason.MESSAGE


def test_targets_take_message_ends_floored_to_the_unit() -> None:
    targets = checkpoint_targets(3000, UNIT, BM, False, True, messages=[1012, 1100, 2999])
    # 2999 floors to 2976, also the resend checkpoint `c`: the message is retained longer
    assert targets == {992: MESSAGE, 1088: MESSAGE, 2976: MESSAGE}


def test_targets_with_partial_hits_off_floor_messages_to_s() -> None:
    targets = checkpoint_targets(5000, UNIT, 1536, False, False, messages=[1012, 2012, 4700])
    assert targets == {1536: MESSAGE, 4608: MESSAGE}  # 1012 floors to 0: no target


def test_message_retention_equals_the_junction_and_yields_to_a_pin() -> None:
    assert MESSAGE.retention == JUNCTION.retention
    assert RESEND.retention < MESSAGE.retention < PIN.retention
    targets = checkpoint_targets(3000, UNIT, BM, False, True, pins=[1024], messages=[1024, 3000])
    assert targets[1024] is PIN
    assert targets[2976] is MESSAGE and 3000 not in targets  # 3000 floors onto c (2976)
    targets = checkpoint_targets(3008, UNIT, BM, False, True, messages=[2976, 3008])
    assert targets == {2976: MESSAGE, 3008: MESSAGE}  # over c (2976) and e (3008)


def test_chunks_stop_at_message_ends_in_stops_mode() -> None:
    targets = checkpoint_targets(2100, UNIT, BM, False, True, messages=[1012, 1500])
    chunks, start = [], 0
    while start < 2100:
        chunk = plan_chunk(start, 8192, 2100, BM, 8192, False, targets, True)
        chunks.append(chunk)
        start = chunk.end
    assert chunks == [
        Chunk(992, StopReason.MESSAGE),
        Chunk(1024, StopReason.BLOCK),  # resumed inside a block: its end
        Chunk(1472, StopReason.MESSAGE),
        Chunk(1536, StopReason.BLOCK),
        Chunk(2048, StopReason.BLOCK),
        Chunk(2080, StopReason.RESEND),
        Chunk(2100, StopReason.END),
    ]


def test_inline_mode_writes_message_states_inside_one_chunk() -> None:
    targets = checkpoint_targets(2100, UNIT, BM, False, True, messages=[1012])
    assert plan_chunk(0, 8192, 2100, BM, 8192, False, targets, False) == Chunk(2100, "end")
    positions = state_positions(0, 2100, BM, targets, inline=True)
    assert positions == [512, 992, 1024, 1536, 2048, 2080, 2100]


def test_the_branch_point_is_a_block_state_floored_as_the_junction_is() -> None:
    # floored to U with partial hits on; to S with them off
    targets = checkpoint_targets(1024, UNIT, BM, False, True, branch=775)
    assert targets == {992: RESEND, 1024: EXTENSION, 768: BLOCK}
    targets = checkpoint_targets(10000, UNIT, 1536, False, False, branch=2000)
    assert targets == {1536: BLOCK}
    # claimed twice, the reason retained longest stays
    targets = checkpoint_targets(10000, UNIT, BM, False, True, junction=576, branch=590)
    assert targets == {9984: RESEND, 512: JUNCTION, 576: JUNCTION}
    targets = checkpoint_targets(1024, UNIT, BM, False, True, branch=1010)
    assert targets == {992: RESEND, 1024: EXTENSION}
