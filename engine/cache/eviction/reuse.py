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
the queues' heads: a free state's *place* is its class, or its class and its divergence count
`n` as it was when it was queued (refreshed when a request diverges at its key). Among the
heads, an orphan (a state whose key the attention pool no longer holds: no hit can resume from
it) goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence

from engine.cache.block import Block, InvariantError
from engine.cache.entry import RETENTION, TAIL_REASONS, CheckpointReason, Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.divergence import MAX_TALLIED, DivergenceCounts
from engine.cache.eviction.reuse_rates import ReuseRates
from engine.hashing import BlockHash

REASONS = list(CheckpointReason)
REASON_INDEX = {reason: index for index, reason in enumerate(REASONS)}
REASON_CLASS = {reason: 1 + 2 * index for reason, index in REASON_INDEX.items()}  # unread
EMPTY = 0  # the class of a block with no entry; then 1 + 2 * reason index + was read
# the Mamba pool's `block` states a new family's first request wrote (`DivergenceCounts.is_root`),
# + was read: a class of their own, so those that siblings read apart from those nobody does
ROOT = 1 + 2 * len(REASONS)
NUM_CLASSES = ROOT + 2
# the Mamba pool's other places: per divergence count `n >= 1` (capped) one place per class,
# `COUNTED + (n - 1) * NUM_CLASSES + class`
COUNTED = NUM_CLASSES
# the attention pool's other places: a block some cached state needs (`couple_support`), one
# place per class, `SUPPORTED + class`, each given up only once no other block is left
SUPPORTED = NUM_CLASSES
# the horizon in frees per block of the pool:
# long for states (a prefix family comes back after many requests), short for attention KV (its
# pool then keeps the recently used prefixes, the ones the few states are likely to belong to)
STATE_HORIZON_PER_BLOCK = 32.0
ATTENTION_HORIZON_PER_BLOCK = 1.0
# a state of a prefix nobody passed before is written while its class is read at least this
# often (one time in twenty): below it, the block it takes is worth more to what is cached
ADMIT_RATE = 0.05
# a new family's `block` states start valued as a request's tail states (`resend`,
# `extension`), above other `block` states: before a sibling marks where the family parts,
# they are the only states its siblings could resume from (picked from 2 to 5 on
# benchmarks/pressure.py: docs/benchmarks.md)
ROOT_RETENTION = RETENTION[CheckpointReason.RESEND]
# what one more expected read is worth in the Mamba pool's order, in horizons: a state whose
# family is expected to come back `n` more times outlives one never read by `3 n` horizons
EXPECTED_READ_WEIGHT = 3.0
# the Mamba pool's unread tail states (`resend`, `extension`, no divergence count) give up
# their newest first while their class is read at least this often: where tails are read (a
# next turn resumes from its session's tail), sessions come round in turn and the oldest
# unread tail is the one read next; where nobody reads them the class's rate falls below it and
# the oldest goes first again (picked from 0.05 to 0.3 on benchmarks/pressure.py:
# docs/benchmarks.md)
NEWEST_FIRST_RATE = 0.15
NEWEST_FIRST = frozenset(REASON_CLASS[reason] for reason in TAIL_REASONS)


def newest_first(queue: OrderedDict[int, int]) -> Iterator[tuple[int, int]]:
    """A newest-first place's blocks, newest first, each ranked at the oldest one's stamp."""
    oldest = next(iter(queue.values()))
    for block_id in reversed(queue):
        yield block_id, oldest


def class_of(place: int) -> int:
    """The class of a place: itself, or the class a counted (Mamba) or supported (attention)
    place holds."""
    return place if place < COUNTED else (place - COUNTED) % NUM_CLASSES


def counted_place(klass: int, count: int) -> int:
    """A state's place in the Mamba pool: its class, or its class under divergence `count`."""
    return klass if not count else COUNTED + (count - 1) * NUM_CLASSES + klass


def class_priors() -> list[float]:
    """Each class's rate before anything is learnt: its reason's retention over a pin's (a
    block read once a little above one never read); a new family's `block` states' at
    `ROOT_RETENTION`."""
    top = RETENTION[CheckpointReason.PIN]
    priors = [0.0]
    for retention in [*(RETENTION[reason] for reason in REASONS), ROOT_RETENTION]:
        base = retention / (top + 1)
        priors += [base, base + 0.5 / (top + 1)]
    return priors


class ReuseLearned(EvictionPolicy):
    """One LRU queue per place; the head of lowest `stamp + weight` goes first."""

    name = "reuse"
    admits_all = False
    reads_support = True
    #: a junction state is refused only when it would go first, a message state only when a
    #: state just past it is written (`admits`)
    REFUSABLE = EvictionPolicy.REFUSABLE | {CheckpointReason.JUNCTION, CheckpointReason.MESSAGE}

    def __init__(
        self, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> None:
        super().__init__(blocks, entries, holds_states)
        self.rates = ReuseRates(class_priors(), len(blocks))
        per_block = STATE_HORIZON_PER_BLOCK if holds_states else ATTENTION_HORIZON_PER_BLOCK
        self.horizon = per_block * len(blocks)
        # place -> block id -> the stamp it was freed at, least recently freed first; and the
        # places holding a free block
        num_places = COUNTED + (MAX_TALLIED + 1) * NUM_CLASSES if holds_states else 2 * NUM_CLASSES
        # places from here on are given up only once no other place holds a block
        self._last_tier = num_places if holds_states else SUPPORTED
        self._queues: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(num_places)]
        self._held: set[int] = set()
        self._is_read = [False] * len(blocks)  # read since its entries were cached
        self._counts = [0] * len(blocks)  # a state's divergence count when it was queued
        self._roots = [False] * len(blocks)  # whether a new family's state, when it was queued
        self._stamp = 0
        self._num_free = 0
        self._weights: dict[int, float] | None = None  # per place, until a rate changes
        self._newest: frozenset[int] = frozenset()  # `_newest_first`, read with the weights
        # where requests diverged, for admitting and ordering states (the Mamba pool only)
        self.divergence = DivergenceCounts() if holds_states else None
        self.prefix_entries: Mapping[BlockHash, Entry] | None = None  # `couple`
        self.support: Mapping[BlockHash, int] | None = None  # `couple_support`

    def couple(self, prefix_entries: Mapping[BlockHash, Entry]) -> None:
        if self.holds_states:
            self.prefix_entries = prefix_entries

    def couple_support(self, support: Mapping[BlockHash, int]) -> None:
        if not self.holds_states:
            self.support = support

    @property
    def num_free(self) -> int:
        return self._num_free

    def klass(self, block: Block) -> int:
        """The block's class: its highest-retention reason (`ROOT` for a `block` state a new
        family's first request wrote, as it was when queued) and whether it was read since it
        was cached; EMPTY with no entry. Changes nothing."""
        best, best_retention = None, -1
        entries = self.entries
        for key in block.keys:
            reason = entries[key].reason
            retention = RETENTION[reason]
            if retention > best_retention:
                best, best_retention = reason, retention
        if best is None:
            return EMPTY
        block_id = block.block_id
        if best is CheckpointReason.BLOCK and self._roots[block_id]:
            return ROOT + self._is_read[block_id]
        return REASON_CLASS[best] + self._is_read[block_id]

    def place(self, block: Block, count: int | None = None) -> int:
        """The queue the block belongs in: its class, or in the Mamba pool its class under its
        divergence `count` (its queued one when None), or in the attention pool its class among
        the blocks a cached state needs. Changes nothing."""
        klass = self.klass(block)
        if klass == EMPTY:
            return klass
        if self.divergence is None:
            return self._supported(block, klass)
        if count is None:
            count = self._counts[block.block_id]
        return counted_place(klass, count)

    def _supported(self, block: Block, klass: int) -> int:
        """An attention block's place: its class, among the supported places when a cached
        state needs one of its keys (`couple_support`)."""
        support = self.support
        if support:
            for key in block.keys:
                if key in support:
                    return SUPPORTED + klass
        return klass

    def _is_root(self, block: Block) -> bool:
        """Whether a new family's first request passed one of the block's keys first
        (`DivergenceCounts.is_root`); False outside the Mamba pool."""
        divergence = self.divergence
        return divergence is not None and any(divergence.is_root(key) for key in block.keys)

    def _state_class(self, key: BlockHash, reason: CheckpointReason) -> int:
        """The class a state keyed `key` for `reason` would have, unread."""
        if reason is CheckpointReason.BLOCK and self.divergence.is_root(key):
            return ROOT
        return REASON_CLASS[reason]

    def _count_of(self, keys: Sequence[BlockHash]) -> int:
        """The largest divergence count among `keys` (a block's), capped; 0 outside the Mamba
        pool."""
        if self.divergence is None:
            return 0
        ends = self.divergence.ends
        return min(max((ends(key) for key in keys), default=0), MAX_TALLIED + 1)

    def _weight(self, place: int) -> float:
        """`rate * horizon` of the place's class; for a counted place whose count the divergence
        table can judge, `expected * EXPECTED_READ_WEIGHT * horizon`."""
        if place < COUNTED or self.divergence is None:
            return self.rates.rate(class_of(place)) * self.horizon
        count, klass = divmod(place - COUNTED, NUM_CLASSES)
        expected = self.divergence.expected_at(count + 1)
        if expected is None:
            return self.rates.rate(klass) * self.horizon
        return expected * EXPECTED_READ_WEIGHT * self.horizon

    def _in_order(self) -> Iterator[Block]:
        """The free blocks in the order `take` gives them up, without taking any: the empty
        blocks, oldest first; then, one at a time, among the other places' heads the oldest
        orphan (`couple`), else the lowest `stamp + weight` (the lower class, then the older,
        on a tie), the attention pool's supported places last (`couple_support`). A place's
        head is its oldest block, but in a newest-first place (`_newest_first`) its newest,
        ranked at the oldest one's stamp. The weights are read once a walk: nothing here
        changes them."""
        weights = self._weights
        if weights is None:  # a rate changed: so may the newest-first places
            weights = self._weights = {}
            self._newest = self._newest_first()
        blocks, queues = self.blocks, self._queues
        for block_id in queues[EMPTY]:
            yield blocks[block_id]
        iters, heads = {}, {}
        newest = self._newest
        for place in self._held:
            if place != EMPTY:
                queue = queues[place]
                iters[place] = newest_first(queue) if place in newest else iter(queue.items())
                heads[place] = next(iters[place])
                if place not in weights:
                    weights[place] = self._weight(place)
        prefixes, last_tier = self.prefix_entries, self._last_tier
        while heads:
            best = None if prefixes is None else self._oldest_orphan(heads)
            if best is None:
                best_priority, best_stamp, best_tier = 0.0, 0, False
                for place, (_, stamp) in heads.items():
                    priority, tier = stamp + weights[place], place >= last_tier
                    if (
                        best is None
                        or tier < best_tier
                        or tier == best_tier
                        and (
                            priority < best_priority
                            or priority == best_priority
                            and (class_of(place), stamp) < (class_of(best), best_stamp)
                        )
                    ):
                        best, best_priority, best_stamp, best_tier = place, priority, stamp, tier
            yield blocks[heads[best][0]]
            following = next(iters[best], None)
            if following is None:
                del heads[best]
            else:
                heads[best] = following

    def _newest_first(self) -> frozenset[int]:
        """The Mamba pool's places that give up their newest block first: the unread tail
        states' (`NEWEST_FIRST`) while their class is read at least `NEWEST_FIRST_RATE` of
        the time. Changes nothing."""
        if self.divergence is None:
            return frozenset()
        rate = self.rates.rate
        return frozenset(place for place in NEWEST_FIRST if rate(place) >= NEWEST_FIRST_RATE)

    def _oldest_orphan(self, heads: dict[int, tuple[int, int]]) -> int | None:
        """The place whose head is the oldest orphan among `heads`, None without one."""
        best, best_stamp, prefixes, blocks = None, 0, self.prefix_entries, self.blocks
        for place, (block_id, stamp) in heads.items():
            if (best is None or stamp < best_stamp) and not any(
                key in prefixes for key in blocks[block_id].keys
            ):
                best, best_stamp = place, stamp
        return best

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        num_empty = len(self._queues[EMPTY])
        if limit is not None and num_empty >= limit:
            return limit  # blocks with no entry go first, and hold nothing retained
        if retention == 0:  # the empty blocks, all before any block with an entry
            return num_empty
        return self.count_up_to(self._in_order(), retention, limit)

    def add(self, block: Block) -> None:
        block_id = block.block_id
        if not block.keys:
            self._is_read[block_id] = False
            place = EMPTY
        elif self.divergence is None:  # the attention pool: its class, supported or not
            keys = block.keys
            if len(keys) == 1:  # `place`, inline for one key: every attention block freed
                key = keys[0]
                place = REASON_CLASS[self.entries[key].reason] + self._is_read[block_id]
                support = self.support
                if support and key in support:
                    place += SUPPORTED
            else:
                place = self._supported(block, self.klass(block))
        else:
            count = self._counts[block_id] = self._count_of(block.keys)
            self._roots[block_id] = self._is_root(block)
            place = self.place(block, count)
        block.free_queue = place
        self._stamp += 1
        queue = self._queues[place]
        if not queue:
            self._held.add(place)
        queue[block_id] = self._stamp
        self._num_free += 1

    def _unqueue(self, block: Block) -> int:
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
        if place != EMPTY:  # held again while cached: a read
            self.rates.hit(class_of(place))
            self._weights = None
            self._is_read[block.block_id] = True

    def update(self, block: Block) -> None:
        """Move a free block to the place its entries, its divergence count and whether a new
        family wrote it now call for, last in it."""
        place = block.free_queue
        if place is None:
            return
        if self.divergence is not None:
            self._roots[block.block_id] = self._is_root(block)
        if place != self.place(block, self._count_of(block.keys)):
            self._unqueue(block)
            self.add(block)

    def take(self, num: int) -> list[Block]:
        empty = self._queues[EMPTY]
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
                self._held.discard(EMPTY)
            self._num_free -= num
            return taken
        taken = [block for block, _ in zip(self._in_order(), range(num), strict=False)]
        for block in taken:
            place = self._unqueue(block)
            klass = class_of(place)
            self._is_read[block.block_id] = False
            if klass != EMPTY:
                deepest = max(block.keys, key=lambda key: self.entries[key].position)
                self.rates.evicted(klass, deepest)
                self._weights = None
        return taken

    def observe(self, hashes: Sequence[BlockHash]) -> int | None:
        """Learns from the chain; in the Mamba pool returns where the prompt branched off
        earlier ones that went on (`Divergence.is_branch`), None elsewhere."""
        self.rates.observe(hashes, self.entries, deepest_only=self.holds_states)
        self._weights = None
        if self.divergence is None:
            return None
        diverged = self.divergence.observe(hashes)
        if diverged is None:
            return None
        entry = self.entries.get(diverged.key)
        if entry is not None:  # its state's count rose: its place may move
            self.update(self.blocks[entry.block_id])
        return diverged.length if diverged.is_branch else None

    def admits(
        self, key: BlockHash, reason: CheckpointReason, span: Sequence[BlockHash] = ()
    ) -> bool:
        """Under pressure, a `block`, `resend` or `extension` state whose prefix an earlier
        request passed is written only when some request diverged within its `span` (it would
        resume from it): else a deeper state serves them all, and the next request that
        diverges there writes it. One whose prefix is new is written while its class is read
        at least `ADMIT_RATE` of the time (`refused` learns from a refusal). Nor is a state
        written that, freed now, would rank below the cached state it displaces
        (`_goes_first`): asked of junction states too (refusable here alone), but not of the
        first `block` or junction state of a new prefix, from which its family is counted.
        A message state is asked only when the request writes the state after it (the
        coordinator): it is written when a request diverged within its `span`; else not when
        that state lies less than two units past it (the `resend` state past a chat's last
        message serves every request that passes that unit), and one further below it (a
        message the request goes on past: an earlier turn's, in a chat) whose prefix is new,
        but not a new family's, is asked its rank as a tail state is. Interval states and pins
        are always written."""
        divergence = self.divergence
        if reason not in self.REFUSABLE or divergence is None:
            return True
        if reason is CheckpointReason.MESSAGE:
            if divergence.diverged_within(span):
                return True
            if len(span) <= 1:  # the state just past it serves every request passing it
                return False
            # a message the request goes on past: of a new prefix (not a new family's), it is
            # asked its rank as a tail state is
            if divergence.count(key) <= 1 and not divergence.is_root(key):
                return not self._goes_first(key, reason)
            return True
        is_junction = reason is CheckpointReason.JUNCTION
        if divergence.count(key) > 1:  # an earlier request passed it
            if not is_junction and not divergence.diverged_within(span):
                return False
        elif is_junction:
            return True
        elif self.rates.rate(self._state_class(key, reason)) < ADMIT_RATE:
            return False
        elif reason is CheckpointReason.BLOCK:  # a new prefix's: its family is counted from it
            return True
        return not self._goes_first(key, reason)

    def _goes_first(self, key: BlockHash, reason: CheckpointReason) -> bool:
        """Whether a state keyed `key` for `reason`, freed now, would rank below the first
        cached state an allocation gives up (past the empty blocks; an orphan, worth nothing,
        never loses to it): writing it would give up a state worth more than itself. Changes
        nothing."""
        count = self._count_of((key,))
        klass = self._state_class(key, reason)
        priority = self._stamp + 1 + self._weight(counted_place(klass, count))
        prefixes = self.prefix_entries
        for block in self._in_order():  # it reads `_newest` afresh before the first block
            victim = block.free_queue
            if victim == EMPTY:
                continue
            if prefixes is not None and not any(k in prefixes for k in block.keys):
                return False
            queue = self._queues[victim]
            stamp = next(iter(queue.values())) if victim in self._newest else queue[block.block_id]
            return priority < stamp + self._weight(victim)
        return False

    def refused(self, key: BlockHash, reason: CheckpointReason) -> None:
        """A state whose prefix was new, refused for its class's rate or its rank, counts as
        given up at once: its ghost lets a later request that would have resumed from it raise
        the class. One refused because a deeper state serves its prefix (a message state
        too: its class holds the system prompts' states), or whose family's count ranked it
        low, teaches nothing."""
        if (
            self.divergence is not None
            and self.divergence.count(key) <= 1
            and reason is not CheckpointReason.MESSAGE
        ):
            self.rates.evicted(self._state_class(key, reason), key)
            self._weights = None

    def check_invariants(self) -> None:
        num_free = 0
        for place, queue in enumerate(self._queues):
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
            if place is not None and block.block_id not in self._queues[place]:
                raise InvariantError(
                    f"block {block.block_id}: records free place {place} but is not queued there"
                )
