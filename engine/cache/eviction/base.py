"""The interface every eviction policy implements: which free block an allocation gives up.

The pool (`engine.cache.block_pool`) owns the blocks, their reference and pin counts and the
entries; it tells the policy when a block becomes free, is held again, or changes its entries.
The policy owns only the free blocks' order: its queues, `Block.free_queue`, and its count of
free blocks. No method may change a block's counts, keys or entries: evicting the entries of a
block the policy gives up is the pool's job. Pins and blocks in use are never free, so never
given up. What only some policies do (learn from prompts, refuse states, read the other pool)
is in `abilities.py`, asked for by type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from engine.cache.block import Block
from engine.cache.entry import Entry, highest_retention
from engine.hashing import BlockHash


class EvictionPolicy(ABC):
    """The free blocks of one pool, in the order allocations take them."""

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        """`blocks` and `entries` are the pool's own, read but never changed here. No block is
        free until the pool `add`s it. `holds_states`: each block holds one recurrent state
        (the Mamba pool), else a span of attention KV."""
        self.blocks = blocks
        self.entries = entries
        self.holds_states = holds_states

    @classmethod
    def for_pool(
        cls, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> EvictionPolicy:
        """The policy for one pool, what the registry builds (`make_policy`): this class, or
        for a policy with a class per pool the one for that pool. Changes nothing."""
        return cls(blocks, entries, holds_states)

    def retention(self, block: Block) -> int:
        """The highest retention among the block's entries, 0 for none. Changes nothing."""
        return highest_retention(block.keys, self.entries)

    def count_up_to(self, in_order: Iterable[Block], retention: int, limit: int | None) -> int:
        """`num_free_up_to` for a policy that can list its free blocks `in_order`, the order
        `take` gives them up in: those before the first retained above `retention`, at most
        `limit`. Reads the level the pool keeps on each block (`Block.retention`, which its
        checks hold equal to `retention(block)`). Changes nothing."""
        num = 0
        for block in in_order:
            if num == limit or block.retention > retention:
                break
            num += 1
        return num

    @property
    @abstractmethod
    def num_free(self) -> int:
        """Blocks an allocation may take, cached ones included. Changes nothing."""

    @abstractmethod
    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        """How many blocks allocations would take, from the next on, before the first whose
        entries include one retained above `retention` (`CheckpointReason.retention`): what
        allocating gives up; counting stops at `limit` (None: no limit). Changes nothing."""

    @abstractmethod
    def add(self, block: Block) -> None:
        """A block no request and no pin holds joins the free blocks (it may hold entries).
        Changes the policy's queues and sets `block.free_queue`."""

    def add_all(self, blocks: list[Block]) -> None:
        """`add` each block in turn, so they join the free blocks in that order (a freed
        table's blocks, in one call). Changes what `add` changes."""
        for block in blocks:
            self.add(block)

    @abstractmethod
    def remove(self, block: Block) -> None:
        """A free block is held again (a reference or a pin): it leaves the free blocks.
        Changes the policy's queues (and what it learns of a read) and sets `block.free_queue`
        to None."""

    @abstractmethod
    def update(self, block: Block) -> None:
        """The block's entries changed (added, moved away, a reason raised): a free block may
        move in the order, changing the policy's queues and `block.free_queue`. Nothing for a
        held block."""

    @abstractmethod
    def take(self, num: int) -> list[Block]:
        """Remove the next `num` free blocks and return them in the order given up; the pool
        has checked that `num <= num_free`. Changes the policy's queues (and what it learns
        of an eviction) and sets each block's `free_queue` to None; their entries are still
        on them."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first block whose place in the policy's queues
        disagrees with `Block.free_queue` or its entries, or a count that disagrees with the
        queues. Runs after the pool has checked counts and entries. Changes nothing."""
