"""The retention policy: an LRU queue per retention level, the lowest level given up first.

A free block's level is the highest retention among its entries (0 for none), capped below
pins (docs/rules.md section 12): the pool keeps that retention on the block (`Block.retention`),
so adding a block is O(1). Within a level the least recently freed block goes first, so
a request's table, freed tail first, loses its tail before its head.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.cache.block import Block, InvariantError
from engine.cache.entry import Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.hashing import BlockHash

#: Free-queue levels: 0 holds blocks with no entry, then one per retention value below pins.
NUM_FREE_LEVELS = 5


class RetentionLRU(EvictionPolicy):
    """One LRU queue per retention level: interval < block < resend = extension < junction =
    message; a block at a lower level is always given up before any at a higher one."""

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        super().__init__(blocks, entries, holds_states)
        # level -> block ids, least recently freed first (an OrderedDict as an ordered set)
        self._queues: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(NUM_FREE_LEVELS)]
        self._num_free = 0

    @property
    def num_free(self) -> int:
        return self._num_free

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        num = sum(len(queue) for queue in self._queues[: retention + 1])
        return num if limit is None else min(num, limit)

    def level(self, block: Block) -> int:
        """The queue the block's entries call for, from its stored retention."""
        retention = block.retention
        return retention if retention < NUM_FREE_LEVELS else NUM_FREE_LEVELS - 1

    def add(self, block: Block) -> None:
        retention = block.retention
        level = retention if retention < NUM_FREE_LEVELS else NUM_FREE_LEVELS - 1
        block.free_queue = level
        self._queues[level][block.block_id] = None
        self._num_free += 1

    def add_all(self, blocks: list[Block]) -> None:
        queues, top = self._queues, NUM_FREE_LEVELS - 1
        for block in blocks:
            level = block.retention
            if level > top:
                level = top
            block.free_queue = level
            queues[level][block.block_id] = None
        self._num_free += len(blocks)

    def remove(self, block: Block) -> None:
        del self._queues[block.free_queue][block.block_id]
        block.free_queue = None
        self._num_free -= 1

    def update(self, block: Block) -> None:
        """Move a free block to the level its entries now call for, keeping it last."""
        if block.free_queue is not None and block.free_queue != self.level(block):
            self.remove(block)
            self.add(block)

    def take(self, num: int) -> list[Block]:
        taken: list[Block] = []
        append, blocks = taken.append, self.blocks
        left = num
        for queue in self._queues:
            if not left:
                break
            popitem = queue.popitem
            for _ in range(min(left, len(queue))):
                block = blocks[popitem(last=False)[0]]
                block.free_queue = None
                append(block)
            left = num - len(taken)
        self._num_free -= len(taken)
        return taken

    def check_invariants(self) -> None:
        num_free = 0
        for level, queue in enumerate(self._queues):
            for block_id in queue:
                block = self.blocks[block_id]
                if block.free_queue != level:
                    raise InvariantError(
                        f"block {block_id}: in free level {level} "
                        f"but records level {block.free_queue}"
                    )
                if block.retention != self.retention(block):
                    raise InvariantError(
                        f"block {block_id}: stored retention {block.retention} but its "
                        f"entries call for {self.retention(block)}"
                    )
                if level != self.level(block):
                    raise InvariantError(f"block {block_id}: free level {level} is stale")
                num_free += 1
        if num_free != self._num_free:
            raise InvariantError(f"free count {self._num_free} != queued {num_free}")
        for block in self.blocks:
            level = block.free_queue
            if level is not None and block.block_id not in self._queues[level]:
                raise InvariantError(
                    f"block {block.block_id}: records free level {block.free_queue} "
                    "but is not queued there"
                )
