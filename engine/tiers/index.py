"""What a tier holds, by key: each unit's parent and bytes, in least-recently-used order, and
which units are leaves (the ones a tier may give up).

A child is useless without its prefix, and a prefix outliving its children is fine, so a tier
gives up only leaves: units with no child in the tier and no hold on them. A hold is a child
held elsewhere that the tier's owner counts here (`TierStack` holds, on the disk tier, the
parent of every unit in host memory). Among leaves the least recently used goes first. Keys of
children and holds are kept whether or not the parent is present, so a parent that arrives
after its children is no leaf from its first moment.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from engine.cache.block import InvariantError
from engine.hashing import BlockHash

#: what a tier's own removal returns (the unit, or its key)
Removed = TypeVar("Removed")


class Record(NamedTuple):
    parent: BlockHash | None  # the unit before it, None for a chain's first
    num_bytes: int  # what it costs the tier (tensor bytes in memory, file bytes on disk)
    start: int = 0  # the unit's token range `[start, end)`
    end: int = 0


class UnitIndex:
    def __init__(self, name: str, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"{name} tier: capacity_bytes {capacity_bytes} < 0")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.num_bytes = 0
        # every unit, least recently used first (an OrderedDict as an ordered map)
        self.records: OrderedDict[BlockHash, Record] = OrderedDict()
        self.children: dict[BlockHash, set[BlockHash]] = {}  # parent -> its children here
        self.holds: Counter[BlockHash] = Counter()  # key -> children held elsewhere

    def __contains__(self, key: BlockHash) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def is_leaf(self, key: BlockHash) -> bool:
        return not self.children.get(key) and not self.holds[key]

    def add(self, key: BlockHash, record: Record) -> None:
        """Index a unit as the most recently used; the caller made room for it."""
        if key in self.records:
            raise InvariantError(f"{self.name} tier: unit {key.hex()} added twice")
        self.records[key] = record
        self.num_bytes += record.num_bytes
        if record.parent is not None:
            self.children.setdefault(record.parent, set()).add(key)

    def discard(self, key: BlockHash) -> Record | None:
        """Unindex a unit; its children, if any stay, keep their parent key."""
        record = self.records.pop(key, None)
        if record is None:
            return None
        self.num_bytes -= record.num_bytes
        if record.parent is not None:
            siblings = self.children[record.parent]
            siblings.discard(key)
            if not siblings:
                del self.children[record.parent]
        return record

    def touch(self, key: BlockHash) -> None:
        """The unit was read: it becomes the most recently used."""
        self.records.move_to_end(key)

    def hold(self, key: BlockHash) -> None:
        self.holds[key] += 1

    def release(self, key: BlockHash) -> None:
        self.holds[key] -= 1
        if self.holds[key] <= 0:
            del self.holds[key]

    def victim(self) -> BlockHash | None:
        """The least recently used leaf, None when every unit is some unit's parent or held.
        A scan from the oldest: a hit loads its chain root first (`TierStack.load`), so
        ancestors are rarely older than their leaves and the scan rarely goes far."""
        return next((key for key in self.records if self.is_leaf(key)), None)

    def can_fit(self, num_bytes: int) -> bool:
        return self.num_bytes + num_bytes <= self.capacity_bytes

    def evict(
        self, num_bytes: int, keep: BlockHash | None, remove: Callable[[BlockHash], Removed]
    ) -> list[Removed]:
        """`remove` each least recently used leaf in turn (the tier's own removal, which
        discards it here) until `num_bytes` more would fit or no leaf is left; never `keep` (a
        unit about to gain a child); what each `remove` returned, in order."""
        if keep is not None:
            self.hold(keep)
        evicted = []
        try:
            while not self.can_fit(num_bytes):
                key = self.victim()
                if key is None:
                    break
                evicted.append(remove(key))
        finally:
            if keep is not None:
                self.release(keep)
        return evicted

    def descendants(self, key: BlockHash) -> list[BlockHash]:
        """The units here that chain from `key` (not `key` itself), children before theirs."""
        found, frontier = [], list(self.children.get(key, ()))
        while frontier:
            child = frontier.pop()
            found.append(child)
            frontier.extend(self.children.get(child, ()))
        return found

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first unit whose bookkeeping is inconsistent."""
        total = sum(record.num_bytes for record in self.records.values())
        if total != self.num_bytes:
            raise InvariantError(f"{self.name} tier: counts {self.num_bytes} bytes, holds {total}")
        if self.num_bytes > self.capacity_bytes:
            raise InvariantError(
                f"{self.name} tier: {self.num_bytes} bytes over its {self.capacity_bytes}"
            )
        for key, record in self.records.items():
            if record.parent is not None and key not in self.children.get(record.parent, ()):
                raise InvariantError(
                    f"{self.name} tier: unit {key.hex()} missing from its parent's children"
                )
        for parent, children in self.children.items():
            for child in children:
                if child not in self.records or self.records[child].parent != parent:
                    raise InvariantError(
                        f"{self.name} tier: unit {child.hex()} listed under {parent.hex()}"
                    )
        for key, count in self.holds.items():
            if count <= 0:
                raise InvariantError(f"{self.name} tier: unit {key.hex()} held {count} times")
