"""The `reuse` policy of the Mamba pool: the shared queues and rates (`reuse.py`), ordered and
admitted by where prompts diverge (`DivergenceCounts`), with orphans first.

A state's place holds its divergence count `n` as it was when it was queued (`Place.count`,
refreshed when a request diverges at its key): a counted place is valued by how many more
requests are expected to diverge there, judged by how those counts ended up for every key.
A `block` state a new family's first request wrote is `ROOT`. A state whose key the attention
pool no longer holds (an orphan, `couple`) goes right after the empty blocks. The unread tail
states go newest first while their class is read at least `NEWEST_FIRST_RATE` of the time.
Under pressure, `admits` says which states are worth writing at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.cache.block import Block
from engine.cache.entry import TAIL_REASONS, CheckpointReason, Entry
from engine.cache.eviction.abilities import Admits, Demotes, ReadsPrefixes
from engine.cache.eviction.divergence import MAX_TALLIED, DivergenceCounts
from engine.cache.eviction.reuse import ReuseLearned
from engine.cache.eviction.reuse_places import EMPTY, EMPTY_PLACE, REASON_CLASS, ROOT, Place
from engine.hashing import BlockHash

# the horizon in frees per block of the pool: long for states (a prefix family comes back
# after many requests), short for attention KV (`reuse_attention.ATTENTION_HORIZON_PER_BLOCK`)
STATE_HORIZON_PER_BLOCK = 32.0
# a state of a prefix nobody passed before is written while its class is read at least this
# often (one time in twenty): below it, the block it takes is worth more to what is cached
ADMIT_RATE = 0.05
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
NEWEST_FIRST = frozenset(REASON_CLASS[reason] for reason in TAIL_REASONS)  # their classes


class StateReuse(ReuseLearned, Admits, Demotes, ReadsPrefixes):
    """The Mamba pool's queues: one per class and divergence count."""

    HORIZON_PER_BLOCK = STATE_HORIZON_PER_BLOCK
    #: a junction state is refused only when it would go first, a message state only when a
    #: state just past it is written (`admits`)
    REFUSABLE = Admits.REFUSABLE | {CheckpointReason.JUNCTION, CheckpointReason.MESSAGE}

    def __init__(self, blocks: list[Block], entries: dict[BlockHash, Entry]) -> None:
        super().__init__(blocks, entries, holds_states=True)
        self._counts = [0] * len(blocks)  # a state's divergence count when it was queued
        self._roots = [False] * len(blocks)  # whether a new family's state, when it was queued
        self.divergence = DivergenceCounts()  # where requests diverged
        self.prefix_entries: Mapping[BlockHash, Entry] | None = None  # `couple`
        # each divergence count's places, one per class, made once (the hot path reads them)
        self._places = [
            [Place(klass, count) for klass in range(len(self.rates.priors))]
            for count in range(MAX_TALLIED + 2)
        ]

    def couple(self, prefix_entries: Mapping[BlockHash, Entry]) -> None:
        self.prefix_entries = prefix_entries

    def _reason_class(self, block: Block, reason: CheckpointReason) -> int:
        """`ROOT` for a `block` state a new family's first request wrote (as it was when
        queued), else the reason's class."""
        if reason is CheckpointReason.BLOCK and self._roots[block.block_id]:
            return ROOT
        return REASON_CLASS[reason]

    def place(self, block: Block, count: int | None = None) -> Place:
        """The block's class under its divergence `count` (its queued one when None).
        Changes nothing."""
        klass = self.klass(block)
        if klass == EMPTY:
            return EMPTY_PLACE
        if count is None:
            count = self._counts[block.block_id]
        return self._places[count][klass]

    def _place_to_add(self, block: Block) -> Place:
        """Notes the block's divergence count and whether a new family wrote it, then its
        place."""
        block_id = block.block_id
        count = self._counts[block_id] = self._count_of(block.keys)
        self._roots[block_id] = self._is_root(block)
        return self.place(block, count)

    def update(self, block: Block) -> None:
        """Move a free block to the place its entries, its divergence count and whether a new
        family wrote it now call for, last in it."""
        if block.free_queue is None:
            return
        self._roots[block.block_id] = self._is_root(block)
        if block.free_queue != self.place(block, self._count_of(block.keys)):
            self._unqueue(block)
            self.add(block)

    def _is_root(self, block: Block) -> bool:
        """Whether a new family's first request passed one of the block's keys first
        (`DivergenceCounts.is_root`)."""
        divergence = self.divergence
        return any(divergence.is_root(key) for key in block.keys)

    def _state_class(self, key: BlockHash, reason: CheckpointReason) -> int:
        """The class a state keyed `key` for `reason` would have, unread."""
        if reason is CheckpointReason.BLOCK and self.divergence.is_root(key):
            return ROOT
        return REASON_CLASS[reason]

    def _count_of(self, keys: Sequence[BlockHash]) -> int:
        """The largest divergence count among `keys` (a block's), capped."""
        ends = self.divergence.ends
        return min(max((ends(key) for key in keys), default=0), MAX_TALLIED + 1)

    def _weight(self, place: Place) -> float:
        """`rate * horizon` of the place's class; for a counted place whose count the divergence
        table can judge, `expected * EXPECTED_READ_WEIGHT * horizon`."""
        if not place.count:
            return self.rates.rate(place.klass) * self.horizon
        expected = self.divergence.expected_at(place.count)
        if expected is None:
            return self.rates.rate(place.klass) * self.horizon
        return expected * EXPECTED_READ_WEIGHT * self.horizon

    def _newest_first(self) -> frozenset[Place]:
        """The unread tail states' places (`NEWEST_FIRST`, no count) while their class is
        read at least `NEWEST_FIRST_RATE` of the time. Changes nothing."""
        rate, uncounted = self.rates.rate, self._places[0]
        return frozenset(uncounted[k] for k in NEWEST_FIRST if rate(k) >= NEWEST_FIRST_RATE)

    def _oldest_orphan(self, heads: dict[Place, tuple[int, int]]) -> Place | None:
        """The place whose head is the oldest orphan among `heads`, None without one (or
        before `couple`)."""
        prefixes = self.prefix_entries
        if prefixes is None:
            return None
        best, best_stamp, blocks = None, 0, self.blocks
        for place, (block_id, stamp) in heads.items():
            if (best is None or stamp < best_stamp) and not any(
                key in prefixes for key in blocks[block_id].keys
            ):
                best, best_stamp = place, stamp
        return best

    def observe(self, hashes: Sequence[BlockHash]) -> int | None:
        """Learns the rates and where the prompt diverged from the chain; a state at the key
        it diverged at may move (its count rose). Returns where the prompt branched off
        earlier ones that went on (`Divergence.is_branch`), None when it did not."""
        super().observe(hashes)
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
        if reason not in self.REFUSABLE:
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
        priority = self._stamp + 1 + self._weight(self._places[count][klass])
        prefixes = self.prefix_entries
        for block in self._in_order():  # it reads `_newest` afresh before the first block
            victim = block.free_queue
            if victim.klass == EMPTY:
                continue
            if prefixes is not None and not any(k in prefixes for k in block.keys):
                return False
            queue = self._queues[victim]
            stamp = next(iter(queue.values())) if victim in self._newest else queue[block.block_id]
            return priority < stamp + self._weight(victim)
        return False

    def worth_keeping_below(self, key: BlockHash, reason: CheckpointReason) -> bool:
        """A state goes down a tier while its class is read at least `ADMIT_RATE` of the
        time, as a new prefix's state is written (`admits`); interval states, pins and
        junction and message states always (the classes the learnt rates say least of)."""
        if reason not in self.REFUSABLE:
            return True
        return self.rates.rate(self._state_class(key, reason)) >= ADMIT_RATE

    def refused(self, key: BlockHash, reason: CheckpointReason) -> None:
        """A state whose prefix was new, refused for its class's rate or its rank, counts as
        given up at once: its ghost lets a later request that would have resumed from it raise
        the class. One refused because a deeper state serves its prefix (a message state
        too: its class holds the system prompts' states), or whose family's count ranked it
        low, teaches nothing."""
        if self.divergence.count(key) <= 1 and reason is not CheckpointReason.MESSAGE:
            self.rates.evicted(self._state_class(key, reason), key)
            self._weights = None
