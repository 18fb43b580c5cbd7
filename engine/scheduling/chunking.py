"""Where prefill chunks stop and which positions keep a Mamba checkpoint (docs/rules.md sections
5-7).

Pure functions of the geometry, so the worked numbers can be checked directly: with `Bm` 512,
`U` 32, a 10000-token prompt and a budget of 8192 the chunks are 8192, 1536, 256, 16.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

from engine.cache.entry import CheckpointReason


class StopReason:
    BUDGET = "budget"
    BLOCK = "block_boundary"
    END = "end"
    RESEND = CheckpointReason.RESEND.value
    EXTENSION = CheckpointReason.EXTENSION.value
    JUNCTION = CheckpointReason.JUNCTION.value
    MESSAGE = CheckpointReason.MESSAGE.value
    PIN = CheckpointReason.PIN.value


class Chunk(NamedTuple):
    end: int
    stop_reason: str


def resend_checkpoint(num_prompt_tokens: int, unit: int, eagle: bool) -> int:
    """`c`: the checkpoint an exact resend of the prompt hits."""
    if eagle:
        return max(num_prompt_tokens // unit * unit - unit, 0)
    return (num_prompt_tokens - 1) // unit * unit


def extension_checkpoint(num_prompt_tokens: int, unit: int) -> int:
    """`e`: the checkpoint a later turn that extends the prompt hits."""
    return num_prompt_tokens // unit * unit


def checkpoint_targets(
    num_prompt_tokens: int,
    unit: int,
    scheduler_block: int,
    eagle: bool,
    partial_hits: bool,
    junction: int | None = None,
    pins: Iterable[int] = (),
    messages: Iterable[int] = (),
    branch: int | None = None,
) -> dict[int, CheckpointReason]:
    """Positions inside the prompt, beyond block boundaries, whose Mamba state is kept.

    The junction `j` brings `floor(j / S) * S` with it; `messages` are the offsets where the
    prompt's rendered chat messages end, floored to `U`; `branch` is where the prompt parted
    from earlier ones (after the EAGLE drop), a `block` state floored as the junction is. With
    partial hits off only the junction, branch, messages and pins remain, floored to the
    scheduler block. A position claimed twice keeps the reason that is retained longest.
    """
    candidates: list[tuple[int, CheckpointReason]] = []
    if partial_hits:
        resend = resend_checkpoint(num_prompt_tokens, unit, eagle)
        extension = extension_checkpoint(num_prompt_tokens, unit)
        candidates.append((resend, CheckpointReason.RESEND))
        if extension != resend:
            candidates.append((extension, CheckpointReason.EXTENSION))
        floor = unit
    else:
        floor = scheduler_block
    if junction is not None:
        candidates.append((junction // floor * floor, CheckpointReason.JUNCTION))
        # and the block-floored junction: a later prompt that diverges between it and `j` finds
        # a state there (vLLM keeps that one); at or below the hit it is never a stop
        block_floor = junction // scheduler_block * scheduler_block
        candidates.append((block_floor, CheckpointReason.JUNCTION))
    if branch is not None:
        candidates.append((branch // floor * floor, CheckpointReason.BLOCK))
    candidates.extend((pin // floor * floor, CheckpointReason.PIN) for pin in pins)
    candidates.extend((end // floor * floor, CheckpointReason.MESSAGE) for end in messages)
    targets: dict[int, CheckpointReason] = {}
    for position, reason in candidates:
        if not 0 < position <= num_prompt_tokens:
            continue
        current = targets.get(position)
        if current is None or reason.retention > current.retention:
            targets[position] = reason
    return targets


def plan_chunk(
    start: int,
    num_new: int,
    num_tokens: int,
    scheduler_block: int,
    chunk_limit: int,
    eagle: bool,
    targets: Mapping[int, CheckpointReason],
    stops_at_checkpoints: bool,
) -> Chunk | None:
    """The end of a prefill chunk from `start` given `num_new` budgeted tokens, or `None` when
    this step should schedule nothing for the request.

    1. A budget-limited end is floored to the scheduler block `S`; without progress the
       unaligned end is kept when `S > chunk_limit`, else nothing is scheduled.
    2. In `stops` mode the chunk then ends at the first stop strictly inside it: the next `S`
       boundary when resuming inside one, the last block boundary of the prompt (one block
       earlier with EAGLE), and every checkpoint target.
    """
    size = scheduler_block
    end = start + num_new
    reason = StopReason.BUDGET
    if end >= num_tokens:
        end, reason = num_tokens, StopReason.END
    else:
        aligned = end // size * size
        if aligned > start:
            end = aligned
        elif size <= chunk_limit:
            return None
    if not stops_at_checkpoints:
        return Chunk(end, reason)
    stops: list[tuple[int, str]] = []
    if start % size:
        stops.append(((start // size + 1) * size, StopReason.BLOCK))
    last_block = num_tokens - num_tokens % size - (size if eagle else 0)
    stops.append((last_block, StopReason.BLOCK))
    stops.extend((position, reason.value) for position, reason in targets.items())
    for position, why in sorted(stops):
        if start < position < end:
            return Chunk(position, why)
    return Chunk(end, reason)


def state_positions(
    start: int,
    end: int,
    mamba_block: int,
    targets: Mapping[int, CheckpointReason],
    inline: bool,
    refused: Collection[int] = (),
) -> list[int]:
    """Positions whose Mamba state the runner writes for a chunk `[start, end)`, ascending.

    `stops` mode writes only the chunk end; `inline` also writes every block boundary and
    checkpoint target inside the chunk, but for the `refused` ones (the eviction policy's
    admission). The chunk end is always written: it is the live state.
    """
    if not inline:
        return [end]
    inside = {p for p in targets if start < p < end}
    first_boundary = (start // mamba_block + 1) * mamba_block
    inside.update(range(first_boundary, end, mamba_block))
    inside.difference_update(refused)
    return sorted(inside) + [end]
