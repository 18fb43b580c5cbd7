"""The `reuse` policy's classes and places, named once.

A free block's *class* is its highest-retention reason and whether it was read since it was
cached (`ReuseClass`: each reason's read class follows its unread one, so a block's class is
its reason's unread class plus 1 when read); a block with no entry is `EMPTY`, and the Mamba
pool's `block` states a new family's first request wrote are `ROOT`. A class is an `int` (the
learnt rates index them, `ReuseRates`), named by `ReuseClass`.

A free block's *place* is the queue it waits in (`Place`): its class, and in the Mamba pool
its divergence count as it was when it was queued, or in the attention pool whether a cached
state needs one of its keys. `Block.free_queue` holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from engine.cache.entry import RETENTION, CheckpointReason


class ReuseClass(IntEnum):
    """The classes, in the order of `CheckpointReason`, each reason's read class after its
    unread one; the rates index them."""

    EMPTY = 0  # no entry: always given up first
    INTERVAL = 1
    INTERVAL_READ = 2
    BLOCK = 3
    BLOCK_READ = 4
    RESEND = 5
    RESEND_READ = 6
    EXTENSION = 7
    EXTENSION_READ = 8
    JUNCTION = 9
    JUNCTION_READ = 10
    MESSAGE = 11
    MESSAGE_READ = 12
    PIN = 13
    PIN_READ = 14
    # the Mamba pool's `block` states a new family's first request wrote
    # (`DivergenceCounts.is_root`): a class of their own, so those that siblings read apart
    # from those nobody does
    ROOT = 15
    ROOT_READ = 16


EMPTY = ReuseClass.EMPTY
ROOT = ReuseClass.ROOT
#: each reason's unread class (its read one is 1 more)
REASON_CLASS: dict[CheckpointReason, int] = {
    reason: ReuseClass[reason.name] for reason in CheckpointReason
}
# a new family's `block` states start valued as a request's tail states (`resend`,
# `extension`), above other `block` states: before a sibling marks where the family parts,
# they are the only states its siblings could resume from (picked from 2 to 5 on
# benchmarks/pressure.py: docs/benchmarks.md)
ROOT_RETENTION = RETENTION[CheckpointReason.RESEND]


@dataclass(frozen=True, slots=True, eq=False)
class Place:
    """A free block's queue: its class, and what else of the block its pool orders by. Each
    policy makes its places once (`EMPTY_PLACE` is shared) and compares them by identity, the
    cheapest hash on the hot path."""

    klass: int  # a `ReuseClass`
    count: int = 0  # the Mamba pool: its divergence count when queued, capped (0: none)
    supported: bool = False  # the attention pool: a cached state needs one of its keys


#: the place of a block with no entry, in either pool
EMPTY_PLACE = Place(EMPTY)


def class_priors() -> list[float]:
    """Each class's rate before anything is learnt: its reason's retention over a pin's (a
    block read once a little above one never read); a new family's `block` states' at
    `ROOT_RETENTION`."""
    top = RETENTION[CheckpointReason.PIN]
    priors = [0.0]
    for retention in [*(RETENTION[reason] for reason in CheckpointReason), ROOT_RETENTION]:
        base = retention / (top + 1)
        priors += [base, base + 0.5 / (top + 1)]
    return priors
