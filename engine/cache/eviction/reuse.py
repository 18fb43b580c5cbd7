"""The reuse-learning policy: free blocks in classes, each class valued by how often its blocks
were read again, so the states nobody reads go first whatever their reason.

A free block's class is its highest-retention reason and whether it was read since it was
cached (a request resumed from it or held it as part of a hit while it was free); a block with
no entry has a class of its own, always given up first. Each class has a learnt rate,
`ReuseRates.rate`: hits over departures, ghosts of evicted blocks included. Within a class the
least recently freed block goes first; across classes an allocation gives up the head of lowest
`stamp + rate * horizon`, where `stamp` counts the blocks freed so far and `horizon` is a number
of frees per block of the pool (`STATE_HORIZON_PER_BLOCK`, `ATTENTION_HORIZON_PER_BLOCK`): a
block of a class read every time outlives one of a class never read by `horizon` frees, but not
for ever, so the states of a finished prefix family age out. With nothing learnt the rates
follow the retention levels.

Why: under pressure a request's tail states (`resend`, `extension`) are read by nobody in some
workloads (shared system prompts, prefix repetition) and by the next turn in others (agents);
no fixed order of reasons is right for both, a learnt one is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from engine.cache.block import Block, InvariantError
from engine.cache.entry import RETENTION, CheckpointReason, Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.reuse_rates import ReuseRates
from engine.hashing import BlockHash

REASONS = list(CheckpointReason)
REASON_INDEX = {reason: index for index, reason in enumerate(REASONS)}
EMPTY = 0  # the class of a block with no entry; then 1 + 2 * reason index + was read
NUM_CLASSES = 1 + 2 * len(REASONS)
# the horizon in frees per block of the pool:
# long for states (a prefix family comes back after many requests), short for attention KV (its
# pool then keeps the recently used prefixes, the ones the few states are likely to belong to)
STATE_HORIZON_PER_BLOCK = 32.0
ATTENTION_HORIZON_PER_BLOCK = 1.0


def class_priors() -> list[float]:
    """Each class's rate before anything is learnt: its reason's retention over a pin's (a
    block read once a little above one never read)."""
    top = RETENTION[CheckpointReason.PIN]
    priors = [0.0]
    for reason in REASONS:
        base = RETENTION[reason] / (top + 1)
        priors += [base, base + 0.5 / (top + 1)]
    return priors


class ReuseLearned(EvictionPolicy):
    """One LRU queue per class; the head of lowest `stamp + rate * horizon` goes first."""

    name = "reuse"

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        super().__init__(blocks, entries, holds_states)
        self.rates = ReuseRates(class_priors(), len(blocks))
        per_block = STATE_HORIZON_PER_BLOCK if holds_states else ATTENTION_HORIZON_PER_BLOCK
        self.horizon = per_block * len(blocks)
        # class -> block id -> the stamp it was freed at, least recently freed first
        self._queues: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(NUM_CLASSES)]
        self._is_read = [False] * len(blocks)  # read since its entries were cached
        self._stamp = 0
        self._num_free = 0
        self._weights: list[float] | None = None  # `rate * horizon` per class, until one changes

    @property
    def num_free(self) -> int:
        return self._num_free

    def klass(self, block: Block) -> int:
        """The queue the block's entries and reads call for. Changes nothing."""
        best, best_retention = None, -1
        entries = self.entries
        for key in block.keys:
            reason = entries[key].reason
            retention = RETENTION[reason]
            if retention > best_retention:
                best, best_retention = reason, retention
        if best is None:
            return EMPTY
        return 1 + 2 * REASON_INDEX[best] + self._is_read[block.block_id]

    def _in_order(self) -> Iterator[Block]:
        """The free blocks in the order `take` gives them up, without taking any: among the
        classes' heads, the lowest `stamp + rate * horizon` (an empty block first; the lower
        class on a tie). The rates are read once: nothing here changes them."""
        weights = self._weights
        if weights is None:  # a rate changed since the last walk
            weights = [self.rates.rate(klass) * self.horizon for klass in range(NUM_CLASSES)]
            self._weights = weights
        iters, heads = {}, {}  # non-empty classes, ascending
        for klass, queue in enumerate(self._queues):
            if queue:
                iters[klass] = iter(queue.items())
                heads[klass] = next(iters[klass])
        blocks = self.blocks
        while heads:
            best, best_priority = EMPTY, -1.0
            if EMPTY not in heads:
                best = None
                for klass, (_, stamp) in heads.items():
                    priority = stamp + weights[klass]
                    if best is None or priority < best_priority:
                        best, best_priority = klass, priority
            yield blocks[heads[best][0]]
            following = next(iters[best], None)
            if following is None:
                del heads[best]
            else:
                heads[best] = following

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        if limit is not None and len(self._queues[EMPTY]) >= limit:
            return limit  # blocks with no entry go first, and hold nothing retained
        return self.count_up_to(self._in_order(), retention, limit)

    def add(self, block: Block) -> None:
        if not block.keys:
            self._is_read[block.block_id] = False
        klass = self.klass(block)
        block.free_queue = klass
        self._stamp += 1
        self._queues[klass][block.block_id] = self._stamp
        self._num_free += 1

    def remove(self, block: Block) -> None:
        klass = block.free_queue
        del self._queues[klass][block.block_id]
        block.free_queue = None
        self._num_free -= 1
        if klass != EMPTY:  # held again while cached: a read
            self.rates.hit(klass)
            self._weights = None
            self._is_read[block.block_id] = True

    def update(self, block: Block) -> None:
        """Move a free block to the class its entries now call for, last in it."""
        klass = block.free_queue
        if klass is not None and klass != self.klass(block):
            del self._queues[klass][block.block_id]
            self._num_free -= 1
            self.add(block)

    def take(self, num: int) -> list[Block]:
        empty = self._queues[EMPTY]
        if len(empty) >= num:  # the common case: blocks with no entry go first, oldest first
            blocks, is_read = self.blocks, self._is_read
            taken = []
            for _ in range(num):
                block_id, _ = empty.popitem(last=False)
                block = blocks[block_id]
                block.free_queue = None
                is_read[block_id] = False
                taken.append(block)
            self._num_free -= num
            return taken
        taken = [block for block, _ in zip(self._in_order(), range(num), strict=False)]
        for block in taken:
            klass = block.free_queue
            del self._queues[klass][block.block_id]
            block.free_queue = None
            self._is_read[block.block_id] = False
            if klass != EMPTY:
                deepest = max(block.keys, key=lambda key: self.entries[key].position)
                self.rates.evicted(klass, deepest)
                self._weights = None
        self._num_free -= len(taken)
        return taken

    def observe(self, hashes: Sequence[BlockHash]) -> None:
        self.rates.observe(hashes, self.entries, deepest_only=self.holds_states)
        self._weights = None

    def check_invariants(self) -> None:
        num_free = 0
        for klass, queue in enumerate(self._queues):
            for block_id in queue:
                block = self.blocks[block_id]
                if block.free_queue != klass:
                    raise InvariantError(
                        f"block {block_id}: in free class {klass} "
                        f"but records class {block.free_queue}"
                    )
                if klass != self.klass(block):
                    raise InvariantError(f"block {block_id}: free class {klass} is stale")
                num_free += 1
        if num_free != self._num_free:
            raise InvariantError(f"free count {self._num_free} != queued {num_free}")
        for block in self.blocks:
            klass = block.free_queue
            if klass is not None and block.block_id not in self._queues[klass]:
                raise InvariantError(
                    f"block {block.block_id}: records free class {klass} but is not queued there"
                )
