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

The Mamba pool learns two more things, from where requests diverge (`DivergenceCounts`): a
state whose key requests diverged at is ordered by how many more are expected to, judged by
how those counts ended up for every key (a finished family's state goes before a new one's);
and, under pressure, which states are worth writing at all (`admits`). A state whose prefix
the attention pool has given up goes right after the empty blocks (`couple`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence

from engine.cache.block import Block, InvariantError
from engine.cache.entry import RETENTION, CheckpointReason, Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.divergence import DivergenceCounts
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
# a state of a prefix nobody passed before is written while its class is read at least this
# often (one time in twenty): below it, the block it takes is worth more to what is cached
ADMIT_RATE = 0.05
# what one more expected read is worth in the Mamba pool's order, in horizons: a state whose
# family is expected to come back `n` more times outlives one never read by `3 n` horizons
EXPECTED_READ_WEIGHT = 3.0


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
    admits_all = False

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
        # where requests diverged, for admitting states (the Mamba pool only)
        self.divergence = DivergenceCounts() if holds_states else None
        self.prefix_entries: Mapping[BlockHash, Entry] | None = None  # `couple`

    def couple(self, prefix_entries: Mapping[BlockHash, Entry]) -> None:
        if self.holds_states:
            self.prefix_entries = prefix_entries

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

    def _class_weights(self) -> list[float]:
        """`rate * horizon` per class, read once per walk: nothing in a walk changes them."""
        weights = self._weights
        if weights is None:  # a rate changed since the last walk
            weights = [self.rates.rate(klass) * self.horizon for klass in range(NUM_CLASSES)]
            self._weights = weights
        return weights

    def _in_order(self) -> Iterator[Block]:
        """The free blocks in the order `take` gives them up, without taking any: among the
        classes' heads, the lowest `stamp + rate * horizon` (an empty block first; the lower
        class on a tie); in the Mamba pool, `_states_in_order`."""
        if self.divergence is not None:
            yield from self._states_in_order()
            return
        weights = self._class_weights()
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

    def _states_in_order(self) -> Iterator[Block]:
        """The Mamba pool's order: empty blocks first, oldest first; then the orphans, states
        whose keys the attention pool no longer holds (`couple`), oldest first: no request can
        resume from them; then by `stamp + weight` (the lower class on a tie), where `weight`
        is `expected * EXPECTED_READ_WEIGHT * horizon` for a state whose key some requests
        diverged at and whose count the divergence table can judge
        (`DivergenceCounts.expected_more`, the largest among its keys), and its class's
        `rate * horizon` otherwise."""
        blocks, expected_more = self.blocks, self.divergence.expected_more
        for block_id in self._queues[EMPTY]:
            yield blocks[block_id]
        weights, per_read = self._class_weights(), EXPECTED_READ_WEIGHT * self.horizon
        prefixes = self.prefix_entries
        orphans, scored = [], []
        for klass in range(1, NUM_CLASSES):
            for block_id, stamp in self._queues[klass].items():
                keys = blocks[block_id].keys
                if prefixes is not None and not any(key in prefixes for key in keys):
                    orphans.append((stamp, block_id))
                    continue
                more = None
                for key in keys:
                    value = expected_more(key)
                    if value is not None and (more is None or value > more):
                        more = value
                weight = weights[klass] if more is None else more * per_read
                scored.append((stamp + weight, klass, stamp, block_id))
        orphans.sort()
        scored.sort()
        for *_, block_id in [*orphans, *scored]:
            yield blocks[block_id]

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        num_empty = len(self._queues[EMPTY])
        if limit is not None and num_empty >= limit:
            return limit  # blocks with no entry go first, and hold nothing retained
        if retention == 0:  # the empty blocks, all before any block with an entry
            return num_empty
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
        if self.divergence is not None:
            self.divergence.observe(hashes)

    def admits(
        self, key: BlockHash, reason: CheckpointReason, span: Sequence[BlockHash] = ()
    ) -> bool:
        """A `block`, `resend` or `extension` state whose prefix an earlier request passed is
        written when some request diverged within its `span` (it would resume from it), else
        a deeper state serves them all, and the next request that diverges there writes it;
        one whose prefix is new is written while its class is read at least `ADMIT_RATE` of
        the time, and refusing it counts as giving it up at once: its ghost lets a later
        request that would have resumed from it raise its class.
        Interval states and the other reasons are always written."""
        divergence = self.divergence
        if reason not in self.REFUSABLE or divergence is None:
            return True
        if divergence.count(key) > 1:
            return divergence.diverged_within(span) > 0
        klass = 1 + 2 * REASON_INDEX[reason]
        if self.rates.rate(klass) >= ADMIT_RATE:
            return True
        self.rates.evicted(klass, key)
        self._weights = None
        return False

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
