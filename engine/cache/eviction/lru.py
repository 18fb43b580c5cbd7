"""vLLM's policy: one LRU queue of free blocks, the least recently freed given up first.

Reasons are ignored: a block keeps its place when its entries change, and an interval state
is as safe as a junction one. A request's table is freed tail first (by its manager), so its
tail goes before its head, as in vLLM's `FreeKVCacheBlockQueue`.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.cache.block import Block, InvariantError
from engine.cache.entry import Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.hashing import BlockHash

FREE = 0  # `Block.free_queue` of every free block: there is one queue


class PlainLRU(EvictionPolicy):
    """One queue, least recently freed first, whatever the block holds."""

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        super().__init__(blocks, entries, holds_states)
        # block ids, least recently freed first (an OrderedDict as an ordered set)
        self._queue: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        return len(self._queue)

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        """Walks the queue from its head: O(the answer), so callers pass a small `limit`."""
        blocks = self.blocks
        return self.count_up_to((blocks[i] for i in self._queue), retention, limit)

    def add(self, block: Block) -> None:
        block.free_queue = FREE
        self._queue[block.block_id] = None

    def remove(self, block: Block) -> None:
        del self._queue[block.block_id]
        block.free_queue = None

    def update(self, block: Block) -> None:
        """Nothing: the order ignores what a block holds."""

    def take(self, num: int) -> list[Block]:
        taken: list[Block] = []
        queue, blocks = self._queue, self.blocks
        for _ in range(num):
            block = blocks[queue.popitem(last=False)[0]]
            block.free_queue = None
            taken.append(block)
        return taken

    def check_invariants(self) -> None:
        for block_id in self._queue:
            if self.blocks[block_id].free_queue != FREE:
                raise InvariantError(
                    f"block {block_id}: queued free but records {self.blocks[block_id].free_queue}"
                )
        for block in self.blocks:
            if block.free_queue is not None and block.block_id not in self._queue:
                raise InvariantError(f"block {block.block_id}: records free but is not queued")
