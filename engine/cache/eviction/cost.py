"""The cost-aware policy: GreedyDual over the prefill a free block saves, and spare states
admitted only where their prefix recurred (Marconi's idea: recency plus FLOPs saved per byte).

A free block's priority is `clock + tokens * recurrence`, and an allocation gives up the block
of the lowest priority (the least recently freed first among equals). `tokens` is the prefill
the block saves on its own: a state block's deepest entry at `p` saves a `p`-token prefill (a
state is the whole prefix, and every state costs the same bytes); an attention block saves the
tokens of KV it holds (`p - token_start`, at most `Ba`), all blocks the same bytes. `recurrence`
is how many admitted requests' prompts passed the key of that deepest entry (at least 1,
`RecurrenceCounts`): a head shared by many outlives the tails behind it, since counts never
grow along a chain. `clock` is the priority of the block given up last (GreedyDual's inflation):
a block freed later starts higher, so recency still counts, and a valuable block freed long ago
goes once the clock has caught up with it. Reasons are ignored in the order; a block with no
entry has priority `clock`, so it goes before any cached one freed at the same time.

Admission: an `interval` state is written only where its prefix recurred, that is, where
some other request's prompt passed its key too (`recurrence >= 2`, the writer counted), or
while the next block an allocation gives up holds no entry (a spare costs nothing then, so
without pressure every interval state is kept, as under `retention`). Junction states need no
such test: the attention cache held their prefix because another request computed it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from engine.cache.block import Block, InvariantError
from engine.cache.entry import CheckpointReason, Entry
from engine.cache.eviction.abilities import Admits, Learns
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.recurrence import RecurrenceCounts
from engine.hashing import BlockHash

FREE = 0  # `Block.free_queue` of every free block: there is one heap
MIN_RECURRENCE = 2  # an interval state is admitted once its prefix has been passed this often


class CostAware(EvictionPolicy, Learns, Admits):
    """A heap of free blocks by `clock + tokens * recurrence`, with lazy deletion."""

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        super().__init__(blocks, entries, holds_states)
        self.recurrence = RecurrenceCounts()
        self.clock = 0
        # (priority, stamp, block id); an item is live while its stamp is the block's in
        # `_stamps` and the block is free, stale otherwise (skipped when popped)
        self._heap: list[tuple[int, int, int]] = []
        self._stamps = [0] * len(blocks)
        self._next_stamp = 0
        self._num_free = 0

    @property
    def num_free(self) -> int:
        return self._num_free

    def value(self, block: Block) -> int:
        """`tokens * recurrence` of the block's deepest entry; 0 with no entry."""
        deepest = None
        for key in block.keys:
            entry = self.entries[key]
            if deepest is None or entry.position > deepest.position:
                deepest = entry
        if deepest is None:
            return 0
        tokens = deepest.position
        if not self.holds_states and block.token_start is not None:
            tokens -= block.token_start
        return tokens * max(self.recurrence.count(deepest.key), 1)

    def _is_live(self, item: tuple[int, int, int]) -> bool:
        block_id = item[2]
        return self.blocks[block_id].free_queue is not None and self._stamps[block_id] == item[1]

    def _push(self, block: Block) -> None:
        self._next_stamp += 1
        self._stamps[block.block_id] = self._next_stamp
        heapq.heappush(
            self._heap, (self.clock + self.value(block), self._next_stamp, block.block_id)
        )
        if len(self._heap) > 2 * len(self.blocks) + 16:  # drop the stale items
            self._heap = [item for item in self._heap if self._is_live(item)]
            heapq.heapify(self._heap)

    def _in_order(self) -> Iterator[Block]:
        """The free blocks in the order `take` would give them up, without taking any."""
        heap = self._heap
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            item, index = heapq.heappop(frontier)
            if self._is_live(item):
                yield self.blocks[item[2]]
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        return self.count_up_to(self._in_order(), retention, limit)

    def add(self, block: Block) -> None:
        block.free_queue = FREE
        self._num_free += 1
        self._push(block)

    def remove(self, block: Block) -> None:
        block.free_queue = None  # its heap item is stale from now on
        self._num_free -= 1

    def update(self, block: Block) -> None:
        """A free block whose entries changed is valued again, at the current clock."""
        if block.free_queue is not None:
            self._push(block)

    def take(self, num: int) -> list[Block]:
        taken: list[Block] = []
        heap, blocks = self._heap, self.blocks
        while len(taken) < num:
            item = heapq.heappop(heap)
            if not self._is_live(item):
                continue
            self.clock = item[0]
            block = blocks[item[2]]
            block.free_queue = None
            taken.append(block)
        self._num_free -= len(taken)
        return taken

    def observe(self, hashes: Sequence[BlockHash]) -> None:
        """Counts the prompt at each key it passed; changes no block's place."""
        self.recurrence.observe(hashes)

    def admits(
        self, key: BlockHash, reason: CheckpointReason, span: Sequence[BlockHash] = ()
    ) -> bool:
        """An interval state where its prefix recurred or while the next block given up holds
        no entry; every other state. Changes nothing."""
        if reason is not CheckpointReason.INTERVAL:
            return True
        if self.recurrence.count(key) >= MIN_RECURRENCE:
            return True
        next_block = next(self._in_order(), None)
        return next_block is not None and not next_block.keys

    def check_invariants(self) -> None:
        live: dict[int, int] = {}
        for item in self._heap:
            if self._is_live(item):
                if item[0] < self.clock:
                    raise InvariantError(
                        f"block {item[2]}: priority {item[0]} below the clock {self.clock}"
                    )
                live[item[2]] = live.get(item[2], 0) + 1
        for block in self.blocks:
            if block.free_queue is None:
                continue
            if block.free_queue != FREE:
                raise InvariantError(
                    f"block {block.block_id}: records free queue {block.free_queue}"
                )
            num_live = live.get(block.block_id, 0)
            if num_live != 1:
                raise InvariantError(
                    f"block {block.block_id}: free with {num_live} live heap items"
                )
        if len(live) != self._num_free:
            raise InvariantError(f"free count {self._num_free} != live heap items {len(live)}")
