"""Which attention blocks the cached Mamba states need: a hit resumes from a state only through
the attention prefix before it, so an attention block that no cached state lies past, in its
chain, serves no hit until a state is written past it again (docs/rules.md section 12).

The attention keys form a tree (a key's parent is the key of the attention block's end before
it). A cached state at `q` marks the key at `q`; a key is *needed* while a mark lies at it or
below it in the tree. `StateSupport` keeps, per needed key, its marks plus its needed children,
so caching or giving up a state walks up only as far as keys change between needed and not, and
tells the attention pool of each such key (`BlockPool.reorder`), so that a policy reading the
counts (`abilities.ReadsSupport`) can give the blocks no state needs up first. Bounded by
the Mamba pool: one record per cached state (the chain it was cached from and its position).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from engine.cache.block import InvariantError
from engine.cache.block_pool import BlockPool
from engine.cache.entry import Entry
from engine.hashing import BlockHash


class StateSupport:
    """Per needed attention key, the cached states at it plus its needed children."""

    def __init__(self, attention: BlockPool, unit: int) -> None:
        self.attention = attention
        self.unit = unit
        self.block_size = attention.block_size
        self.counts: dict[BlockHash, int] = {}  # needed keys only
        # state key -> the chain it was cached from and its index there
        self._states: dict[BlockHash, tuple[Sequence[BlockHash], int]] = {}

    def parent(self, index: int) -> int:
        """The index of the key of the attention block's end before the key at `index` (-1
        for none)."""
        size = self.block_size
        return ((index + 1) * self.unit - 1) // size * size // self.unit - 1

    def cached(self, hashes: Sequence[BlockHash], position: int) -> None:
        """The Mamba pool holds the state at `position` of the chain `hashes` (a key it held
        already is counted once)."""
        index = position // self.unit - 1
        key = hashes[index]
        if key in self._states:
            return
        self._states[key] = (hashes, index)
        counts, pool = self.counts, self.attention
        while index >= 0:
            key = hashes[index]
            before = counts.get(key, 0)
            counts[key] = before + 1
            if before:  # needed already, and so is every key above it
                return
            pool.reorder(key)
            index = self.parent(index)

    def evicted(self, keys: Iterable[BlockHash]) -> None:
        """The Mamba pool gave up the states keyed `keys`."""
        counts, pool = self.counts, self.attention
        for key in keys:
            state = self._states.pop(key, None)
            if state is None:
                continue
            hashes, index = state
            while index >= 0:
                key = hashes[index]
                count = counts[key] - 1
                if count:  # still needed, and so is every key above it
                    counts[key] = count
                    break
                del counts[key]
                pool.reorder(key)
                index = self.parent(index)

    def check_invariants(self, states: Mapping[BlockHash, Entry]) -> None:
        """Every cached state is marked, nothing else, and each needed key counts its marks and
        its needed children."""
        if self._states.keys() != states.keys():
            stray = next(iter(self._states.keys() ^ states.keys()))
            raise InvariantError(
                f"state support: key {stray.hex()[:16]} is marked but not cached, or cached "
                "but not marked"
            )
        counts: dict[BlockHash, int] = {}
        children: set[tuple[BlockHash, BlockHash]] = set()
        for hashes, index in self._states.values():
            counts[hashes[index]] = counts.get(hashes[index], 0) + 1
            parent = self.parent(index)
            while parent >= 0 and (hashes[index], hashes[parent]) not in children:
                children.add((hashes[index], hashes[parent]))
                counts[hashes[parent]] = counts.get(hashes[parent], 0) + 1
                index, parent = parent, self.parent(parent)
        if counts != self.counts:
            raise InvariantError("state support: the counts disagree with the cached states")
