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

In the Mamba pool a `block` state a new family's first request wrote (a prompt that shared
nothing with earlier ones: `DivergenceCounts.is_root`) has a class of its own, `ROOT`, with a
prior at `ROOT_RETENTION`: its siblings resume from it, while a `block` state past a prefix
shared with earlier prompts (an agent's task past the common system prompt) is passed by.

The Mamba pool learns two more things, from where requests diverge (`DivergenceCounts`): a
state whose key requests diverged at is ordered by how many more are expected to, judged by
how those counts ended up for every key (a finished family's state goes before a new one's);
and, under pressure, which states are worth writing at all (`admits`). A state whose prefix
the attention pool has given up goes right after the empty blocks (`couple`). The other way
round, the attention pool gives up a block that some cached state needs (one lies past it in
its chain: `couple_support`) only once no other block is left, since a hit resumes from a
state through the attention before it, and the blocks past every cached state serve none.

The Mamba pool's unread tail states go newest first while their class is read at least
`NEWEST_FIRST_RATE` of the time: where tails are read at all, a next turn resumes from its
session's tail, and sessions come round in turn, so least recently freed first would give up
exactly the tail read next (40 agent sessions in 41 slots kept none of the first turns' tails
for the second turns). The place keeps its rank among the others (its oldest block's stamp);
only which of its blocks goes changes. Where nobody reads tails the rate falls below the
threshold and the oldest goes first, so stale tails do not stay.

Each of those is a queue of its own, least recently freed first, so an allocation compares only
the queues' heads: a free block's *place* (`reuse_places.Place`) is its class, and in the
Mamba pool its divergence count `n` as it was when it was queued (refreshed when a request
diverges at its key), in the attention pool whether a cached state needs it. Among the heads,
an orphan (a state whose key the attention pool no longer holds: no hit can resume from it)
goes first.

Each pool has a policy of its own: what both share, the queues, the walk and the rates, is
`ReuseLearned` here; the attention pool's (`AttentionReuse`, `reuse_attention.py`) reads the
keys the states need; the Mamba pool's (`StateReuse`, `reuse_states.py`) learns where
prompts diverge, admits states and orders orphans first. The registry names `ReuseByPool`
(`reuse_pools.py`), which builds the one for each pool.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import ClassVar

from engine.cache.block import Block, InvariantError
from engine.cache.entry import RETENTION, CheckpointReason, Entry
from engine.cache.eviction.abilities import Learns
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.reuse_places import (
    EMPTY,
    EMPTY_PLACE,
    REASON_CLASS,
    Place,
    class_priors,
)
from engine.cache.eviction.reuse_rates import ReuseRates
from engine.hashing import BlockHash


def newest_first(queue: OrderedDict[int, int]) -> Iterator[tuple[int, int]]:
    """A newest-first place's blocks, newest first, each ranked at the oldest one's stamp."""
    oldest = next(iter(queue.values()))
    for block_id in reversed(queue):
        yield block_id, oldest


class ReuseLearned(EvictionPolicy, Learns):
    """One LRU queue per place; the head of lowest `stamp + weight` goes first. What both
    pools' classes share; the registry's entry builds the one for a pool (`reuse_pools`)."""

    #: the horizon in frees per block of the pool (`horizon`), set by each pool's class
    HORIZON_PER_BLOCK: ClassVar[float]

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        super().__init__(blocks, entries, holds_states)
        self.rates = ReuseRates(class_priors(), len(blocks))
        self.horizon = self.HORIZON_PER_BLOCK * len(blocks)
        # place -> block id -> the stamp it was freed at, least recently freed first; and the
        # places holding a free block
        self._queues: dict[Place, OrderedDict[int, int]] = {EMPTY_PLACE: OrderedDict()}
        self._empty = self._queues[EMPTY_PLACE]
        self._held: set[Place] = set()
        self._is_read = [False] * len(blocks)  # read since its entries were cached
        self._stamp = 0
        self._num_free = 0
        self._weights: dict[Place, float] | None = None  # per place, until a rate changes
        self._newest: frozenset[Place] = frozenset()  # `_newest_first`, read with the weights

    @property
    def num_free(self) -> int:
        return self._num_free

    def klass(self, block: Block) -> int:
        """The block's class (`ReuseClass`): its highest-retention reason's (`_reason_class`)
        and whether it was read since it was cached; EMPTY with no entry. Changes nothing."""
        best, best_retention = None, -1
        entries = self.entries
        for key in block.keys:
            reason = entries[key].reason
            retention = RETENTION[reason]
            if retention > best_retention:
                best, best_retention = reason, retention
        if best is None:
            return EMPTY
        return self._reason_class(block, best) + self._is_read[block.block_id]

    def _reason_class(self, block: Block, reason: CheckpointReason) -> int:
        """The unread class of a block whose highest-retention reason is `reason`."""
        return REASON_CLASS[reason]

    @abstractmethod
    def place(self, block: Block) -> Place:
        """The queue the free block belongs in (each pool's class says). Changes nothing."""

    def _place_to_add(self, block: Block) -> Place:
        """The place of a block with entries joining the free blocks; may note what the place
        reads of it (the Mamba pool: its divergence count)."""
        return self.place(block)

    def _weight(self, place: Place) -> float:
        """`rate * horizon` of the place's class."""
        return self.rates.rate(place.klass) * self.horizon

    def _newest_first(self) -> frozenset[Place]:
        """The places that give up their newest block first; none by default."""
        return frozenset()

    def _oldest_orphan(self, heads: dict[Place, tuple[int, int]]) -> Place | None:
        """The place whose head goes first whatever its weight; None by default."""
        return None

    def _in_order(self) -> Iterator[Block]:
        """The free blocks in the order `take` gives them up, without taking any: the empty
        blocks, oldest first; then, one at a time, among the other places' heads the oldest
        orphan (`_oldest_orphan`), else the lowest `stamp + weight` (the lower class, then the
        older, on a tie), the attention pool's supported places last. A place's head is its
        oldest block, but in a newest-first place (`_newest_first`) its newest, ranked at the
        oldest one's stamp. The weights are read once a walk: nothing here changes them."""
        weights = self._weights
        if weights is None:  # a rate changed: so may the newest-first places
            weights = self._weights = {}
            self._newest = self._newest_first()
        blocks, queues = self.blocks, self._queues
        for block_id in self._empty:
            yield blocks[block_id]
        iters, heads = {}, {}
        newest = self._newest
        for place in self._held:
            if place.klass != EMPTY:
                queue = queues[place]
                iters[place] = newest_first(queue) if place in newest else iter(queue.items())
                heads[place] = next(iters[place])
                if place not in weights:
                    weights[place] = self._weight(place)
        while heads:
            best = self._oldest_orphan(heads)
            if best is None:
                best_priority, best_stamp, best_tier = 0.0, 0, False
                for place, (_, stamp) in heads.items():
                    priority, tier = stamp + weights[place], place.supported
                    if (
                        best is None
                        or tier < best_tier
                        or tier == best_tier
                        and (
                            priority < best_priority
                            or priority == best_priority
                            and (place.klass, stamp) < (best.klass, best_stamp)
                        )
                    ):
                        best, best_priority, best_stamp, best_tier = place, priority, stamp, tier
            yield blocks[heads[best][0]]
            following = next(iters[best], None)
            if following is None:
                del heads[best]
            else:
                heads[best] = following

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        num_empty = len(self._empty)
        if limit is not None and num_empty >= limit:
            return limit  # blocks with no entry go first, and hold nothing retained
        if retention == 0:  # the empty blocks, all before any block with an entry
            return num_empty
        return self.count_up_to(self._in_order(), retention, limit)

    def add(self, block: Block) -> None:
        block_id = block.block_id
        if not block.keys:
            self._is_read[block_id] = False
            place = EMPTY_PLACE
        else:
            place = self._place_to_add(block)
        block.free_queue = place
        self._stamp += 1
        queue = self._queues.get(place)
        if queue is None:
            queue = self._queues[place] = OrderedDict()
        if not queue:
            self._held.add(place)
        queue[block_id] = self._stamp
        self._num_free += 1

    def _unqueue(self, block: Block) -> Place:
        """Take a free block out of its queue; returns its place."""
        place = block.free_queue
        queue = self._queues[place]
        del queue[block.block_id]
        if not queue:
            self._held.discard(place)
        block.free_queue = None
        self._num_free -= 1
        return place

    def remove(self, block: Block) -> None:
        place = self._unqueue(block)
        if place.klass != EMPTY:  # held again while cached: a read
            self.rates.hit(place.klass)
            self._weights = None
            self._is_read[block.block_id] = True

    def update(self, block: Block) -> None:
        """Move a free block to the place its entries now call for, last in it."""
        place = block.free_queue
        if place is not None and place != self.place(block):
            self._unqueue(block)
            self.add(block)

    def take(self, num: int) -> list[Block]:
        empty = self._empty
        if len(empty) >= num:  # the common case: oldest empty first
            blocks, is_read = self.blocks, self._is_read
            taken = []
            for _ in range(num):
                block_id, _ = empty.popitem(last=False)
                block = blocks[block_id]
                block.free_queue = None
                is_read[block_id] = False
                taken.append(block)
            if not empty:
                self._held.discard(EMPTY_PLACE)
            self._num_free -= num
            return taken
        taken = [block for block, _ in zip(self._in_order(), range(num), strict=False)]
        for block in taken:
            klass = self._unqueue(block).klass
            self._is_read[block.block_id] = False
            if klass != EMPTY:
                deepest = max(block.keys, key=lambda key: self.entries[key].position)
                self.rates.evicted(klass, deepest)
                self._weights = None
        return taken

    def observe(self, hashes: Sequence[BlockHash]) -> int | None:
        """Learns the rates from the chain (`ReuseRates.observe`: a ghost it passes counts a
        hit for its class); no free block moves. None: this pool knows of no branch."""
        self.rates.observe(hashes, self.entries, deepest_only=self.holds_states)
        self._weights = None
        return None

    def check_invariants(self) -> None:
        num_free = 0
        for place, queue in self._queues.items():
            if bool(queue) != (place in self._held):
                raise InvariantError(f"free place {place}: its queue and the held places disagree")
            for block_id in queue:
                block = self.blocks[block_id]
                if block.free_queue != place:
                    raise InvariantError(
                        f"block {block_id}: in free place {place} "
                        f"but records place {block.free_queue}"
                    )
                if place != self.place(block):
                    raise InvariantError(f"block {block_id}: free place {place} is stale")
                num_free += 1
        if num_free != self._num_free:
            raise InvariantError(f"free count {self._num_free} != queued {num_free}")
        for block in self.blocks:
            place = block.free_queue
            if place is not None and block.block_id not in self._queues.get(place, ()):
                raise InvariantError(
                    f"block {block.block_id}: records free place {place} but is not queued there"
                )
