"""What one step moves between the device pools and the tiers, as the runner performs it.

A `UnitSave` copies a usable-hit unit out of device blocks that the step is about to reuse; the
runner performs every save first, before it zeroes the step's new blocks (docs/rules.md
section 10), so it reads what the blocks held when the scheduler gave them up. A `UnitLoad`
writes units read from a tier into a request's fresh blocks, after the step's copies (a load
that starts inside a shared block writes on the private copy of it the step made).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.hashing import BlockHash
from engine.tiers.unit import TierUnit


@dataclass(frozen=True)
class UnitSave:
    """Copy the unit `key` out: the attention of `[start, end)` and the state at `end`."""

    key: BlockHash
    parent: BlockHash | None
    start: int
    end: int
    # the device blocks holding `[start, end)`, in table order: the first holds `start`
    attention_block_ids: tuple[int, ...]
    state_block: int  # the Mamba block holding the state at `end`


@dataclass(frozen=True)
class UnitLoad:
    """Write tier units into a request's table: the attention of `[start, end)` and the state
    at `end`. `units` (root first) cover `[start, end)`; their rows below `start` are not
    written (the device already holds them)."""

    request_id: str
    start: int
    end: int
    attention_block_ids: tuple[int, ...]  # the request's table, covering `[0, end)`
    state_block: int
    units: tuple[TierUnit, ...]
    places: tuple[str, ...]  # the tier each unit was read from: "host" or "disk"
