"""L2 over L3: where a unit the device gives up goes, how it comes back, and what a lookup
over both tiers finds.

`put` stores what the device gives up in host memory; what host memory gives up to make room
is demoted to disk when there is a disk tier (`demote`), else dropped. `load` reads a unit from
the nearest tier that holds it; a unit read from disk is promoted into host memory and kept on
disk too, so a restart still finds it. `lookup` is the longest prefix of a request's chain of
unit keys that some tier holds, and where each lives; the device is the caller's own pool.

A unit is useless without its prefix, so: each tier gives up leaves first (`UnitIndex`); the
disk tier counts, as a hold on a unit, each child of it in host memory, so it never deletes a
parent that a unit above still needs; and when the stack lets go of a unit entirely (given up
by the last tier, refused, or found corrupt) it lets go of every unit below it too. A unit put
while its parent is in no tier is *detached* (the caller's device pool holds the parent) until
its parent arrives.

One caller at a time (the scheduler's thread): the copies between a tier and the device that a
later step runs on a side thread or stream move tensors, never this bookkeeping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.hashing import BlockHash
from engine.tiers.counters import TierStats
from engine.tiers.disk import DiskTier
from engine.tiers.host import HostTier
from engine.tiers.unit import TierUnit

HOST, DISK = HostTier.name, DiskTier.name


class TierHit(NamedTuple):
    num_units: int  # the leading keys of the chain that some tier holds
    places: list[str]  # for each, the nearest tier holding it: "host" or "disk"


@dataclass(frozen=True)
class StackStats:
    host: TierStats
    disk: TierStats | None  # None without a disk tier
    num_demoted: int  # units host memory gave to disk (written, or refreshed if there)
    num_promoted: int  # units read from disk into host memory
    num_dropped: int  # units the stack let go of entirely
    num_cascaded: int  # of those, units dropped because a unit they chain from was
    num_declined: int  # units host memory gave up that were not worth a disk file


class TierStack:
    def __init__(self, host: HostTier, disk: DiskTier | None = None) -> None:
        self.host = host
        self.disk = disk
        self.detached: set[BlockHash] = set()  # held units whose parent is in no tier
        self.num_demoted = self.num_promoted = self.num_dropped = self.num_cascaded = 0
        self.num_declined = 0  # units host memory gave up that `worth_disk` kept off disk
        # asked of each unit host memory gives up to make room: is it worth a disk file? (the
        # owner's eviction policy, `Tiering`); None: every one is
        self.worth_disk: Callable[[BlockHash], bool] | None = None
        self._adopt()

    def _adopt(self) -> None:
        """Take on what the tiers already hold (a disk tier reopened after a restart): the
        disk holds for host units' parents, and which units are detached."""
        for unit in self.host.units.values():
            if self.disk is not None and unit.parent is not None:
                self.disk.index.hold(unit.parent)
        for key, parent in {**self._records(self.disk), **self._records(self.host)}.items():
            if parent is not None and not self.holds(parent):
                self.detached.add(key)

    def holds(self, key: BlockHash) -> bool:
        return key in self.host or (self.disk is not None and key in self.disk)

    def lookup(self, keys: list[BlockHash]) -> TierHit:
        """The longest prefix of `keys` (a request's unit keys, root first) that some tier
        holds, with the nearest tier of each. This operation does not change the tiers."""
        places = []
        for key in keys:
            if key in self.host:
                places.append(HOST)
            elif self.disk is not None and key in self.disk:
                places.append(DISK)
            else:
                break
        return TierHit(len(places), places)

    def put(self, unit: TierUnit) -> str | None:
        """Take a unit the device gives up: into host memory, or straight to disk when host
        memory refuses it. Returns the tier it landed in, None when no tier took it."""
        had_parent = unit.parent is not None and self.holds(unit.parent)
        if self._into_host(unit):
            return HOST
        if had_parent and not self.holds(unit.parent):
            return None  # host memory gave its prefix up for it, and the disk refused that
        return DISK if self._into_disk(unit) else None

    def load(self, key: BlockHash) -> TierUnit | None:
        """The unit from the nearest tier that holds it, refreshed there; from disk, promoted
        into host memory as well. None when no tier holds it or its file was corrupt (then the
        units below it go too). Load a chain root first, so each leaf ends the most recent."""
        if key in self.host:
            return self.host.get(key)
        if self.disk is None or key not in self.disk:
            return None
        unit = self.disk.get(key)
        if unit is None:  # corrupt: deleted by the disk tier
            self._let_go(key)
            return None
        if self._into_host(unit):
            self.num_promoted += 1
        return unit

    def demote(self, key: BlockHash) -> bool:
        """Move a unit from host memory down to disk (dropped, with the units below it, when
        there is no disk tier or it refuses). Returns whether it is on disk now."""
        unit = self.host.remove(key)
        if unit is None:
            return self.disk is not None and key in self.disk
        self._left_host(unit)
        return self._demoted(unit)

    def remove(self, key: BlockHash) -> bool:
        """Let go of a unit in every tier, and of every unit below it. Returns whether any
        tier held it."""
        unit = self.host.remove(key)
        if unit is not None:
            self._left_host(unit)
        on_disk = self.disk is not None and self.disk.remove(key)
        self._let_go(key)
        return unit is not None or on_disk

    def flush(self) -> int:
        """Write every unit in host memory that the disk lacks to disk, roots first, so that
        a restart on the directory finds them (an engine's clean stop). Host memory keeps them
        too. Returns how many were written; none without a disk tier."""
        if self.disk is None:
            return 0
        written = 0
        for unit in sorted(self.host.units.values(), key=lambda unit: unit.start):
            if unit.key in self.host and unit.key not in self.disk and self._into_disk(unit):
                written += 1
        return written

    # ------------------------------------------------------------------ moves
    def _into_host(self, unit: TierUnit) -> bool:
        is_new = unit.key not in self.host
        # with a disk below, a parent given up for its child is demoted, not lost
        result = self.host.put(unit, keep_parent=self.disk is None)
        if result.is_stored and is_new and self.disk is not None and unit.parent is not None:
            self.disk.index.hold(unit.parent)
        for evicted in result.evicted:
            self._left_host(evicted)
            if self.disk is None or self.worth_disk is None or self.worth_disk(evicted.key):
                self._demoted(evicted)
            else:
                self.num_declined += 1
                self._let_go(evicted.key)
        # a demotion the disk refused lets go of the units below it, which may include this
        # one when its parent was on disk only: ask the tier rather than trust `is_stored`
        if unit.key not in self.host:
            return False
        self._arrived(unit)
        return True

    def _into_disk(self, unit: TierUnit) -> bool:
        if self.disk is None:
            return False
        result = self.disk.put(unit)
        for key in result.evicted:
            if key not in self.host:
                self._let_go(key)
        if unit.key not in self.disk:
            return False
        self._arrived(unit)
        return True

    def _demoted(self, unit: TierUnit) -> bool:
        """Host memory gave `unit` up: to disk if it takes it, else the stack lets go."""
        if self._into_disk(unit):
            self.num_demoted += 1
            return True
        self._let_go(unit.key)
        return False

    def _left_host(self, unit: TierUnit) -> None:
        if self.disk is not None and unit.parent is not None:
            self.disk.index.release(unit.parent)

    def _arrived(self, unit: TierUnit) -> None:
        """A tier took `unit`: it is detached if its parent is in no tier, and the units
        below it that waited for it are not any more."""
        if unit.parent is not None and not self.holds(unit.parent):
            self.detached.add(unit.key)
        self.detached.difference_update(self._children(unit.key))

    def _let_go(self, key: BlockHash) -> None:
        """A tier gave up `key`; if no tier holds it now, drop every unit below it too."""
        if self.holds(key):
            return
        self.detached.discard(key)
        self.num_dropped += 1
        for child in self._children(key):
            self.num_cascaded += 1
            self.remove(child)

    def _children(self, key: BlockHash) -> set[BlockHash]:
        children = set(self.host.index.children.get(key, ()))
        if self.disk is not None:
            children |= self.disk.index.children.get(key, set())
        return children

    # ------------------------------------------------------------------ reading the stack
    def stats(self) -> StackStats:
        disk = None if self.disk is None else self.disk.stats()
        return StackStats(
            self.host.stats(),
            disk,
            self.num_demoted,
            self.num_promoted,
            self.num_dropped,
            self.num_cascaded,
            self.num_declined,
        )

    def check_invariants(self) -> None:
        """Each tier's own checks, then the stack's: the disk tier's holds are the parents of
        the units in host memory, and every unit's parent is held unless it is detached."""
        self.host.check_invariants()
        if self.disk is not None:
            self.disk.check_invariants()
            holds = self.disk.index.holds
            parents = Counter(u.parent for u in self.host.units.values() if u.parent is not None)
            for key in parents.keys() | holds.keys():
                if parents[key] != holds[key]:
                    raise InvariantError(
                        f"tier stack: unit {key.hex()} held {holds[key]} times on disk, "
                        f"parent of {parents[key]} units in host memory"
                    )
        units = {**self._records(self.disk), **self._records(self.host)}
        for key, parent in units.items():
            is_held = parent is None or parent in units
            if is_held == (key in self.detached):
                state = "detached" if is_held else "not detached"
                raise InvariantError(
                    f"tier stack: unit {key.hex()} is {state}; parent held: {is_held}"
                )
        for key in self.detached - units.keys():
            raise InvariantError(f"tier stack: unit {key.hex()} detached but in no tier")

    @staticmethod
    def _records(tier: HostTier | DiskTier | None) -> dict[BlockHash, BlockHash | None]:
        if tier is None:
            return {}
        return {key: record.parent for key, record in tier.index.records.items()}
