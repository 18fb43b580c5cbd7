"""L2: usable-hit units in host memory, bounded in bytes at every moment.

Pinned buffers where CUDA is there to copy to (`TierUnit.pinned`), plain CPU tensors otherwise.
A unit larger than the whole tier is refused, not stored; room for a new unit is made by giving
up least recently used leaves (`UnitIndex`), never the new unit's own parent, and what is given
up is returned so that the owner can move it down a tier.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.hashing import BlockHash
from engine.tiers.counters import TierCounters, TierStats
from engine.tiers.index import Record, UnitIndex
from engine.tiers.unit import TierUnit


class HostPut(NamedTuple):
    is_stored: bool  # the unit is in the tier now (it was already, or it was taken)
    evicted: list[TierUnit]  # what was given up to make room, least recently used first


class HostTier:
    name = "host"

    def __init__(self, capacity_bytes: int) -> None:
        self.index = UnitIndex(self.name, capacity_bytes)
        self.units: dict[BlockHash, TierUnit] = {}
        self.counters = TierCounters()

    @property
    def capacity_bytes(self) -> int:
        return self.index.capacity_bytes

    @property
    def num_bytes(self) -> int:
        return self.index.num_bytes

    def __contains__(self, key: BlockHash) -> bool:
        return key in self.units

    def contains(self, key: BlockHash) -> bool:
        """Whether the unit is here. This operation does not change the tier."""
        return key in self.units

    def keys(self) -> list[BlockHash]:
        return list(self.units)

    def put(self, unit: TierUnit, keep_parent: bool = True) -> HostPut:
        """Store a unit as the most recently used, giving up leaves to make room. A unit
        already here is only refreshed; one larger than the tier is refused. Its parent is
        never given up for it unless `keep_parent` is False (a tier below will keep the
        parent: `TierStack`)."""
        if unit.key in self.units:
            self.index.touch(unit.key)
            return HostPut(True, [])
        if unit.size_bytes > self.capacity_bytes:
            self.counters.num_refused += 1
            return HostPut(False, [])
        evicted = self.evict(unit.size_bytes, keep=unit.parent if keep_parent else None)
        if not self.index.can_fit(unit.size_bytes):
            self.counters.num_refused += 1
            return HostPut(False, evicted)
        self.units[unit.key] = unit.pinned()
        self.index.add(unit.key, Record(unit.parent, unit.size_bytes, unit.start, unit.end))
        self.counters.bytes_in += unit.size_bytes
        return HostPut(True, evicted)

    def get(self, key: BlockHash) -> TierUnit | None:
        """The unit, refreshed as the most recently used; None when it is not here."""
        unit = self.units.get(key)
        if unit is None:
            self.counters.num_misses += 1
            return None
        self.index.touch(key)
        self.counters.num_hits += 1
        self.counters.bytes_out += unit.size_bytes
        return unit

    def remove(self, key: BlockHash) -> TierUnit | None:
        """Take the unit out (its children here, if any, stay: the owner decides)."""
        unit = self.units.pop(key, None)
        if unit is not None:
            self.index.discard(key)
        return unit

    def evict(self, num_bytes: int, keep: BlockHash | None = None) -> list[TierUnit]:
        """Give up least recently used leaves until `num_bytes` more would fit, or no leaf is
        left; never `keep` (a unit about to gain a child here)."""
        evicted = self.index.evict(num_bytes, keep, self.remove)
        self.counters.num_evictions += len(evicted)
        return evicted

    def stats(self) -> TierStats:
        return self.counters.snapshot(len(self.units), self.num_bytes, self.capacity_bytes)

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first unit whose bookkeeping is inconsistent."""
        self.index.check_invariants()
        if self.units.keys() != self.index.records.keys():
            odd = next(iter(self.units.keys() ^ self.index.records.keys()))
            raise InvariantError(f"host tier: unit {odd.hex()} held or indexed, not both")
        for key, unit in self.units.items():
            if unit.size_bytes != self.index.records[key].num_bytes:
                raise InvariantError(
                    f"host tier: unit {key.hex()} holds {unit.size_bytes} bytes, indexed as "
                    f"{self.index.records[key].num_bytes}"
                )
