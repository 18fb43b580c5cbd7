"""The interface every eviction policy implements: which free block an allocation gives up,
and which spare Mamba states are worth writing at all.

The pool (`engine.cache.block_pool`) owns the blocks, their reference and pin counts and the
entries; it tells the policy when a block becomes free, is held again, or changes its entries.
The policy owns only the free blocks' order: its queues, `Block.free_queue`, and its count of
free blocks. No method may change a block's counts, keys or entries: evicting the entries of a
block the policy gives up is the pool's job. Pins and blocks in use are never free, so never
given up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from engine.cache.block import Block
from engine.cache.entry import CheckpointReason, Entry, highest_retention
from engine.hashing import BlockHash


class EvictionPolicy(ABC):
    """The free blocks of one pool, in the order allocations take them."""

    #: the name `EVICTION_POLICIES` lists the policy under
    name: ClassVar[str]
    #: True when `admits` says yes to every state (the coordinator then skips asking)
    admits_all: ClassVar[bool] = True
    #: True when an attention pool's policy reads which keys the cached states need
    #: (`couple_support`; the coordinator then keeps the counts)
    reads_support: ClassVar[bool] = False
    #: the reasons whose states `admits` may refuse besides `interval`: what a request writes
    #: for itself (a policy may add `junction` and `message`); a pin state is always written
    REFUSABLE: ClassVar[frozenset[CheckpointReason]] = frozenset(
        {CheckpointReason.BLOCK, CheckpointReason.RESEND, CheckpointReason.EXTENSION}
    )

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        """`blocks` and `entries` are the pool's own, read but never changed here. No block is
        free until the pool `add`s it. `holds_states`: each block holds one recurrent state
        (the Mamba pool), else a span of attention KV."""
        self.blocks = blocks
        self.entries = entries
        self.holds_states = holds_states

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
        Sets `block.free_queue`."""

    def add_all(self, blocks: list[Block]) -> None:
        """`add` each block in turn, so they join the free blocks in that order (a freed
        table's blocks, in one call)."""
        for block in blocks:
            self.add(block)

    @abstractmethod
    def remove(self, block: Block) -> None:
        """A free block is held again (a reference or a pin): it leaves the free blocks.
        Sets `block.free_queue` to None."""

    @abstractmethod
    def update(self, block: Block) -> None:
        """The block's entries changed (added, moved away, a reason raised): a free block may
        move in the order. Nothing for a held block."""

    @abstractmethod
    def take(self, num: int) -> list[Block]:
        """Remove the next `num` free blocks and return them in the order given up; the pool
        has checked that `num <= num_free`. Their entries are still on them."""

    def observe(self, hashes: Sequence[BlockHash]) -> int | None:
        """A request whose prompt chains through `hashes` is being admitted (told once per
        request, at its first admission, before the states it writes are chosen, so `admits`
        already knows its chain). Changes only what the policy learns, never the order of the
        blocks already free. A policy that learns where prompts diverge returns how many of
        `hashes` this one shared before it branched off earlier prompts that went on past
        them (a state there serves the siblings that follow); None when it knows of no such
        branch. Nothing by default."""
        return None

    def couple(self, prefix_entries: Mapping[BlockHash, Entry]) -> None:
        """A Mamba pool's policy is shown the attention pool's entries (read, never changed):
        a state whose key they lack cannot be resumed from, since a hit needs the attention
        prefix too, so a policy may give it up first. Nothing by default."""
        return

    def couple_support(self, support: Mapping[BlockHash, int]) -> None:
        """An attention pool's policy that `reads_support` is shown the attention keys some
        cached Mamba state needs, a state lying at or past the key in its chain, each with a
        positive count (read, never changed; `engine.cache.support`): a block none of whose
        keys is there serves no hit, since a hit resumes from a state. When a key comes or
        goes, the pool `update`s the free block holding it. Nothing by default."""
        return

    def admits(
        self, key: BlockHash, reason: CheckpointReason, span: Sequence[BlockHash] = ()
    ) -> bool:
        """Whether a state keyed `key` is worth a block; asked before it is written, for an
        `interval` state always, and for a state of a `REFUSABLE` reason while the pool has
        no spare block for every state the request writes (a `message` state only when the
        state after it is written, the deepest being asked first). `span`: the request's
        hashes from `key` up to the next state it writes, where a later request would diverge
        and still resume from this one. Changes nothing: asking again, as a waiting request
        does at each admission attempt, gives the same answer. Every state by default."""
        return True

    def refused(self, key: BlockHash, reason: CheckpointReason) -> None:
        """A state `admits` refused was not written: told once, when the request that would
        have written it is admitted. The policy may learn from it (as a state given up at
        once) but no block's place changes. Nothing by default."""
        return

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first block whose place in the policy's queues
        disagrees with `Block.free_queue` or its entries, or a count that disagrees with the
        queues. Runs after the pool has checked counts and entries. Changes nothing."""
