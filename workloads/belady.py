"""One pool of the bound under memory (`bound.py`): items that leave by Belady's rule.

An item is a key with a next use (the index of the next request that reads it, `NEVER` for
none) and a pin count (requests in flight that hold it). Only unpinned items may be evicted,
the one whose next use is farthest first. The order is a max-heap with lazy deletion: an entry
is stale once its item left, was pinned, or got a new next use, and is skipped when it surfaces.
The order-blind reference passes its own priority in the next use's place (`bound.Uses`): the
pool gives up the largest either way.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from itertools import count

from engine.cache.block import InvariantError

NEVER = 1 << 62  # the next use of an item no later request reads


class BeladyPool:
    """The items one pool holds; `evict_to` gives up the farthest-used unpinned ones."""

    def __init__(self) -> None:
        self.next_use: dict[Hashable, int] = {}  # every item held, pinned or not
        self.num_pins: dict[Hashable, int] = {}  # pinned items only
        self._heap: list[tuple[int, int, Hashable]] = []  # (-next use, tie, key), unpinned
        self._tie = count()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.next_use

    def __len__(self) -> int:
        return len(self.next_use)

    def put(self, key: Hashable, next_use: int) -> None:
        """Hold `key` (again) with this next use."""
        self.next_use[key] = next_use
        if key not in self.num_pins:
            heapq.heappush(self._heap, (-next_use, next(self._tie), key))

    def pin(self, key: Hashable) -> None:
        """A request in flight holds `key`, which the pool holds: it cannot be evicted."""
        self.num_pins[key] = self.num_pins.get(key, 0) + 1

    def unpin(self, key: Hashable) -> None:
        left = self.num_pins[key] - 1
        if left:
            self.num_pins[key] = left
            return
        del self.num_pins[key]
        heapq.heappush(self._heap, (-self.next_use[key], next(self._tie), key))

    def evict_to(self, capacity: int) -> list[Hashable]:
        """Evict the unpinned items of farthest next use until at most `capacity` are held or
        every one left is pinned; returns the evicted keys."""
        evicted = []
        heap = self._heap
        while len(self.next_use) > capacity and heap:
            negative_use, _, key = heapq.heappop(heap)
            if self.next_use.get(key) != -negative_use or key in self.num_pins:
                continue  # stale: gone, pinned, or a newer next use has its own entry
            del self.next_use[key]
            evicted.append(key)
        return evicted

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming an item pinned but not held, or a pin count below 1."""
        for key, pins in self.num_pins.items():
            if key not in self.next_use or pins < 1:
                raise InvariantError(f"item {key!r}: {pins} pins but held={key in self}")
