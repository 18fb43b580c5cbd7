"""One physical block of a cache group, and the errors its pool raises."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from engine.hashing import BlockHash


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than the free queue holds."""


class InvariantError(AssertionError):
    """A pool or manager found its own state inconsistent."""


@dataclass(slots=True)
class Block:
    block_id: int
    ref_cnt: int = 0  # request-table slots and this step's holds that point at it
    pin_cnt: int = 0  # operators' pins that hold it
    keys: list[BlockHash] = field(default_factory=list)  # the entries it holds
    # the highest retention among its entries' reasons, 0 for none; only the pool sets it,
    # where entries change, so a policy reads it in O(1) (`check_invariants` verifies it)
    retention: int = 0
    token_start: int | None = None  # the first token position of its span
    # which of the eviction policy's free queues holds it while free (the policy's own key:
    # a level, a `reuse` place); None while held. Only the policy sets it
    # (`engine.cache.eviction`)
    free_queue: Hashable | None = None
    pending_step: int | None = None  # the step whose copy fills it, until that step ends
    last_change: int = 0  # the step it last changed in

    @property
    def state(self) -> str:
        if self.pin_cnt:
            return "pinned"
        if self.ref_cnt:
            return "in_use"
        return "cached" if self.keys else "free"
