"""Every eviction policy over random pool traces: no pin or block in use is ever given up, and
each policy gives blocks up in the order of an independent model written from its docstring,
so what stays cached (what a lookup would hit) is the model's after every step."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cache.block_pool import BlockPool
from engine.cache.entry import RETENTION, CheckpointReason
from engine.cache.eviction import EVICTION_POLICIES
from engine.cache.eviction.abilities import Admits, Learns, ReadsPrefixes, ReadsSupport
from engine.cache.eviction.divergence import MAX_TALLIED, MIN_PAST
from engine.cache.eviction.reuse_attention import ATTENTION_HORIZON_PER_BLOCK
from engine.cache.eviction.reuse_places import ROOT, ROOT_RETENTION
from engine.cache.eviction.reuse_rates import GHOSTS_PER_BLOCK, PRIOR
from engine.cache.eviction.reuse_states import (
    ADMIT_RATE,
    EXPECTED_READ_WEIGHT,
    NEWEST_FIRST_RATE,
    STATE_HORIZON_PER_BLOCK,
)

NUM_BLOCKS = 10
BLOCK_SIZE = 4
REASONS = [r for r in CheckpointReason if r is not CheckpointReason.PIN]
REASONS_ALL = list(CheckpointReason)


def unread_class(reason: CheckpointReason) -> int:
    """The model's own count of a reason's unread class: its index pair's first."""
    return 1 + 2 * REASONS_ALL.index(reason)


# the model's unread `resend` and `extension` classes
UNREAD_TAIL_CLASSES = [
    unread_class(r) for r in (CheckpointReason.RESEND, CheckpointReason.EXTENSION)
]


def key_of(index: int) -> bytes:
    """Keys whose recurrence slots all differ, so the model's exact counts are the policy's."""
    return index.to_bytes(8, "little") + b"k" * 8


# ------------------------------------------------------------------ (a) safety, every policy
operations = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "free", "touch", "pin", "unpin", "cache", "move", "observe"]),
        st.integers(0, NUM_BLOCKS - 1),
        st.integers(0, 3),
        st.sampled_from(REASONS),
    ),
    max_size=60,
)


@pytest.mark.parametrize("policy", list(EVICTION_POLICIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=operations, holds_states=st.booleans())
def test_no_policy_gives_up_a_pinned_block_or_one_in_use(policy, trace, holds_states) -> None:
    pool = BlockPool(NUM_BLOCKS, BLOCK_SIZE, "g", 0, eviction=policy, holds_states=holds_states)
    next_key = 0
    for action, block_id, num, reason in trace:
        block = pool.blocks[block_id]
        if action == "allocate" and num <= pool.num_free:
            held = {b.block_id for b in pool.blocks if b.ref_cnt or b.pin_cnt}
            taken = pool.allocate(num)
            assert not held & {b.block_id for b in taken}, (held, taken)
            assert len({b.block_id for b in taken}) == num
        elif action == "free" and block.ref_cnt:
            pool.free([block_id])
        elif action == "touch":
            pool.touch(block_id)
        elif action == "pin":
            pool.pin(block_id)
        elif action == "unpin" and block.pin_cnt:
            pool.unpin(block_id)
        elif action == "cache":  # fresh keys, or raise the reason of an existing one
            keys = [(key_of(next_key + i), 4 * block_id + 1 + i, reason) for i in range(num)]
            if block.keys:
                start = block.token_start
                keys = [(key_of(next_key), start + 1, reason), (block.keys[0], start + 1, reason)]
            next_key += len(keys)
            pool.cache(block_id, keys, None)
        elif action == "move" and block.ref_cnt and not block.pin_cnt and pool.num_free:
            (dst,) = pool.allocate(1)
            pool.move_hashes(block_id, dst.block_id)
        elif action == "observe" and isinstance(pool.eviction, Learns):
            pool.eviction.observe([key_of(i) for i in range(num + block_id)])
        pool.check_invariants()
        assert pool.num_free == sum(1 for b in pool.blocks if not b.ref_cnt and not b.pin_cnt)


# ------------------------------------------------------------------ (b) each policy's model
class ReuseModel:
    """`reuse` from its docstring: free blocks as (place, stamp), the place a class (a reason's
    index in `CheckpointReason` and whether the block was read while cached) and, for states,
    the divergence count when placed; per class hits and departures; ghosts of evicted deepest
    keys, FIFO; empty blocks first, then among each place's oldest block the oldest orphan (the
    attention pool lacks its every key), else the lowest `stamp + weight`. A state's `block`
    reason whose key a chain sharing nothing with earlier ones passed first has a class of its
    own (`ROOT`: after every reason's pair), its prior at `ROOT_RETENTION`."""

    def __init__(self, holds_states: bool) -> None:
        self.holds_states = holds_states
        per_block = STATE_HORIZON_PER_BLOCK if holds_states else ATTENTION_HORIZON_PER_BLOCK
        self.horizon = per_block * NUM_BLOCKS
        self.stamp = 0
        self.is_read: set[int] = set()
        self.hits: Counter[int] = Counter()
        self.departures: Counter[int] = Counter()
        self.ghosts: dict[bytes, int] = {}  # insertion order is eviction order
        self.passed: Counter[bytes] = Counter()  # requests whose chain passed each key
        self.diverged: Counter[bytes] = Counter()  # requests that diverged at each key
        self.lasts: Counter[bytes] = Counter()  # chains that ended at each key
        self.branch: int | None = None  # the last chain's branch point, in keys
        self.roots: set[bytes] = set()  # keys first passed by a chain sharing none before
        self.support: dict[bytes, int] | None = None  # attention: keys cached states need

    def klass(self, entries: dict[bytes, tuple[int, CheckpointReason]], block_id: int) -> int:
        if not entries:
            return 0
        reasons = [why for _, why in entries.values()]
        best = next(why for why in reasons if RETENTION[why] == max(map(RETENTION.get, reasons)))
        return self.class_of(best, any(key in self.roots for key in entries)) + (
            block_id in self.is_read
        )

    def class_of(self, reason: CheckpointReason, root: bool) -> int:
        """Unread: a reason's index pair, or past them all a new family's `block` state's."""
        if self.holds_states and root and reason is CheckpointReason.BLOCK:
            return 1 + 2 * len(CheckpointReason)
        return unread_class(reason)

    def rate(self, klass: int) -> float:
        top = RETENTION[CheckpointReason.PIN] + 1
        index = (klass - 1) // 2
        level = ROOT_RETENTION if index == len(CheckpointReason) else RETENTION[REASONS_ALL[index]]
        prior = (level + 0.5 * ((klass - 1) % 2)) / top
        return (self.hits[klass] + PRIOR * prior) / (self.departures[klass] + PRIOR)

    def place(self, entries: dict, block_id: int) -> tuple:
        """(class, divergence count, needed by a cached state): the count for states only, the
        last for attention blocks only."""
        klass = self.klass(entries, block_id)
        if not klass:
            return (klass, 0, False)
        if not self.holds_states:
            support = self.support or {}
            return (klass, 0, any(support.get(key) for key in entries))
        return (klass, min(max(self.diverged[key] for key in entries), MAX_TALLIED + 1), False)

    def rank(self, entries: dict, block_id: int) -> tuple:
        if not entries:
            self.is_read.discard(block_id)
        self.stamp += 1
        return (self.place(entries, block_id), self.stamp)

    def read(self, rank: tuple | None, block_id: int) -> None:
        if rank is not None and rank[0][0]:
            self.hits[rank[0][0]] += 1
            self.departures[rank[0][0]] += 1
            self.is_read.add(block_id)

    def expected_at(self, count: int) -> float | None:
        """States: from the divergence counts every key ended up with, how many more requests
        diverge at a key `count` did (None past the tallied counts, or when fewer than
        `MIN_PAST` keys got further)."""
        if count > MAX_TALLIED:
            return None
        counts = [min(c, MAX_TALLIED + 1) for c in self.diverged.values() if c]
        further = [c for c in counts if c > count]
        if len(further) < MIN_PAST:
            return None
        return sum(c - count for c in further) / sum(1 for c in counts if c >= count)

    def weight(self, klass: int, count: int) -> float:
        """`rate * horizon`, or for a state whose count the others' counts judge, `expected *
        EXPECTED_READ_WEIGHT * horizon`."""
        expected = self.expected_at(count) if count else None
        if expected is not None:
            return expected * EXPECTED_READ_WEIGHT * self.horizon
        return self.rate(klass) * self.horizon

    def next_block(self, free: dict[int, tuple], keys: dict, attention: dict | None) -> int:
        """The block `next_head` names."""
        return self.next_head(free, keys, attention)[0]

    def next_head(
        self, free: dict[int, tuple], keys: dict, attention: dict | None
    ) -> tuple[int, int]:
        """The next block to go and the stamp it ranks at: the oldest empty block; else among
        each place's head (its oldest block, or in a newest-first place its newest, ranked at
        the oldest's stamp) the oldest orphan; else, among the heads no cached state needs if
        there is one, the lowest `stamp + weight` (the lower class, then the older, on a
        tie)."""
        empty = [b for b in free if not free[b][0][0]]
        if empty:
            block_id = min(empty, key=lambda b: free[b][1])
            return block_id, free[block_id][1]
        oldest: dict[tuple, int] = {}
        newest: dict[tuple, int] = {}
        for block_id, (place, stamp) in free.items():
            if place not in oldest or stamp < free[oldest[place]][1]:
                oldest[place] = block_id
            if place not in newest or stamp > free[newest[place]][1]:
                newest[place] = block_id
        heads = {
            place: (newest[place] if self.is_newest_first(place) else block_id, free[block_id][1])
            for place, block_id in oldest.items()
        }
        unneeded = {place: head for place, head in heads.items() if not place[2]}
        heads = unneeded or heads
        if attention is not None:
            orphans = [h for h in heads.values() if not any(k in attention for k in keys[h[0]])]
            if orphans:
                return min(orphans, key=lambda head: head[1])

        def priority(item: tuple) -> tuple:
            (klass, count, _), (_, stamp) = item
            return (stamp + self.weight(klass, count), klass, stamp)

        return min(heads.items(), key=priority)[1]

    def is_newest_first(self, place: tuple) -> bool:
        """A Mamba place of unread `resend` or `extension` states, no divergence count, whose
        class is read at least `NEWEST_FIRST_RATE` of the time."""
        klass, count, _ = place
        return (
            self.holds_states
            and not count
            and klass in UNREAD_TAIL_CLASSES
            and self.rate(klass) >= NEWEST_FIRST_RATE
        )

    def evicted(self, rank: tuple, block_id: int, entries: dict) -> None:
        klass = rank[0][0]
        self.is_read.discard(block_id)
        if klass:
            self.departures[klass] += 1
            deepest = max(entries, key=lambda key: entries[key][0])
            self.ghosts.pop(deepest, None)
            self.ghosts[deepest] = klass
            if len(self.ghosts) > GHOSTS_PER_BLOCK * NUM_BLOCKS:
                del self.ghosts[next(iter(self.ghosts))]

    def admits(
        self,
        key: bytes,
        reason: CheckpointReason,
        span: list[bytes],
        free: dict[int, tuple],
        keys: dict,
        attention: dict | None,
    ) -> bool:
        """Refusable states (the Mamba pool): by the divergence within `span` once an earlier
        request passed `key`, else by the class's rate (a refusal by rate leaves a ghost); then
        one that would rank below the first cached block given up is refused, but for the
        first `block` or junction state of a new prefix. A message state: written where a
        request diverged within `span`, refused below a state within a unit, else asked its
        rank when its prefix is new but not a new family's."""
        refusable = (
            CheckpointReason.BLOCK,
            CheckpointReason.RESEND,
            CheckpointReason.EXTENSION,
            CheckpointReason.JUNCTION,
            CheckpointReason.MESSAGE,
        )
        if not self.holds_states or reason not in refusable:
            return True
        klass = self.class_of(reason, key in self.roots)
        if reason is CheckpointReason.MESSAGE:
            if any(self.diverged[k] for k in span):
                return True
            if len(span) <= 1:  # the next state, within a unit, serves them
                return False
            if self.passed[key] <= 1 and key not in self.roots:  # passed, of a new prefix
                return not self.ranks_below(klass, key, free, keys, attention)
            return True
        if self.passed[key] > 1:
            if reason is not CheckpointReason.JUNCTION and not any(self.diverged[k] for k in span):
                return False
        elif reason is CheckpointReason.JUNCTION:
            return True
        elif self.rate(klass) < ADMIT_RATE:
            return False
        elif reason is CheckpointReason.BLOCK:
            return True
        return not self.ranks_below(klass, key, free, keys, attention)

    def ranks_below(
        self, klass: int, key: bytes, free: dict[int, tuple], keys: dict, attention: dict | None
    ) -> bool:
        """Whether a state of `klass` keyed `key`, freed now, ranks below the first cached
        block given up (an orphan there never outranks it)."""
        cached = {block_id: rank for block_id, rank in free.items() if rank[0][0]}
        if not cached:
            return False
        victim, victim_stamp = self.next_head(cached, keys, attention)
        if attention is not None and not any(k in attention for k in keys[victim]):
            return False  # an orphan goes first whatever is written
        (victim_class, victim_count, _), _ = cached[victim]
        count = min(self.diverged[key], MAX_TALLIED + 1)
        mine = self.stamp + 1 + self.weight(klass, count)
        return mine < victim_stamp + self.weight(victim_class, victim_count)

    def refused(self, key: bytes, reason: CheckpointReason) -> None:
        """A refusal of a new prefix's state (by rate or rank) leaves a ghost; one by
        divergence, or of a message state, nothing."""
        if self.holds_states and self.passed[key] <= 1 and reason is not CheckpointReason.MESSAGE:
            klass = self.class_of(reason, key in self.roots)
            self.departures[klass] += 1
            self.ghosts.pop(key, None)
            self.ghosts[key] = klass
            if len(self.ghosts) > GHOSTS_PER_BLOCK * NUM_BLOCKS:
                del self.ghosts[next(iter(self.ghosts))]

    def observe(self, hashes: list[bytes], cached: set[bytes]) -> bytes | None:
        """Learns from a prompt's chain; returns the key it diverged at (states only)."""
        for key in reversed(hashes):
            if key in cached:
                break
            if key in self.ghosts:
                self.hits[self.ghosts.pop(key)] += 1
                if self.holds_states:
                    break
        if not self.holds_states:
            return None
        # where it diverged: the last key of the run passed before, found by bisection (a real
        # chain's passed keys are a prefix of it; these drawn chains need not be)
        run, high = 0, len(hashes)
        while run < high:
            middle = (run + high) // 2
            if self.passed[hashes[middle]]:
                run = middle + 1
            else:
                high = middle
        key = hashes[run - 1] if run else None
        # a branch: some earlier chain went on past the key (not all of them ended there)
        self.branch = run if run and self.passed[key] > self.lasts[key] else None
        self.passed.update(hashes)
        if hashes:
            self.lasts[hashes[-1]] += 1
        if not run:  # it shared no key with earlier chains: a new family's first
            self.roots.update(hashes)
        if not run:
            return None
        self.diverged[key] += 1
        return key


class Model:
    """Free blocks with a rank, taken lowest first; cached keys per block; counts per key."""

    def __init__(self, policy: str, holds_states: bool) -> None:
        self.policy = policy
        self.holds_states = holds_states
        self.free: dict[int, tuple] = {}
        self.keys: dict[int, dict[bytes, tuple[int, CheckpointReason]]] = {}
        self.counts: Counter[bytes] = Counter()
        self.time = 0
        self.clock = 0  # cost: the priority of the block given up last
        self.reuse = ReuseModel(holds_states)
        self.attention: dict[bytes, None] | None = None  # the attention pool's keys, if coupled

    def rank(self, block_id: int) -> tuple:
        """retention: (level, time freed); lru: (time freed,); cost: (clock + value, time);
        reuse: (class, stamp), ordered at `take` by the rates learnt then."""
        self.time += 1
        entries = self.keys.get(block_id, {})
        if self.policy == "reuse":
            return self.reuse.rank(entries, block_id)
        if self.policy == "retention":
            level = max((RETENTION[why] for _, why in entries.values()), default=0)
            return (min(level, 4), self.time)
        if self.policy == "lru":
            return (self.time,)
        if not entries:
            return (self.clock, self.time)
        key, (position, _) = max(entries.items(), key=lambda item: item[1][0])
        tokens = position if self.holds_states else position - (position - 1) // 4 * 4
        return (self.clock + tokens * max(self.counts[key], 1), self.time)

    def add(self, block_id: int) -> None:
        self.free[block_id] = self.rank(block_id)

    def changed(self, block_id: int, before: tuple) -> None:
        """Its entries changed: retention moves it when its level changes, cost re-ranks it,
        lru keeps its place."""
        if block_id not in self.free:
            return
        if self.policy == "reuse":
            place = self.reuse.place(self.keys.get(block_id, {}), block_id)
            moved = place != before[0]
        else:
            moved = self.policy == "retention" and self.rank(block_id)[0] != before[0]
        if self.policy == "cost" or moved:
            self.free[block_id] = self.rank(block_id)

    def take(self, num: int) -> list[int]:
        if self.policy == "reuse":  # one take learns from its evictions once it is done
            ranks = {}
            for _ in range(num):
                block_id = self.reuse.next_block(self.free, self.keys, self.attention)
                ranks[block_id] = self.free.pop(block_id)
            for block_id, rank in ranks.items():
                self.reuse.evicted(rank, block_id, self.keys.pop(block_id, {}))
            return list(ranks)
        order = sorted(self.free, key=lambda b: self.free[b])[:num]
        for block_id in order:
            if self.policy == "cost":
                self.clock = self.free[block_id][0]
            del self.free[block_id]
            self.keys.pop(block_id, None)
        return order

    def cached(self) -> set[bytes]:
        return {key for entries in self.keys.values() for key in entries}

    def holder(self, key: bytes) -> int | None:
        """The free block that caches `key`, if any."""
        return next((b for b in self.free if key in self.keys.get(b, {})), None)

    def admits(self, key: bytes, reason: CheckpointReason, span: list[bytes]) -> bool:
        """reuse: its model; cost: an interval state where its prefix recurred or the next
        block to go holds no entry; the others write every state."""
        if self.policy == "reuse":
            return self.reuse.admits(key, reason, span, self.free, self.keys, self.attention)
        if self.policy != "cost" or reason is not CheckpointReason.INTERVAL:
            return True
        if self.counts[key] >= 2:
            return True
        return bool(self.free) and not self.keys.get(min(self.free, key=self.free.get))


ACTIONS = ["allocate"] * 3 + ["free"] * 3 + ["touch", "cache", "cache", "observe", "observe"]
ACTIONS += ["admit", "attention", "support", "support"]


def observe_both(pool: BlockPool, model: Model, hashes: list[bytes]) -> None:
    """Show a chain to the policy and its model: the same branch point, and a state whose
    divergence count rose moves in both."""
    policy = pool.eviction
    branch = policy.observe(hashes) if isinstance(policy, Learns) else None
    model.counts.update(hashes)
    diverged = model.reuse.observe(hashes, model.cached())
    assert branch == (model.reuse.branch if model.policy == "reuse" else None)
    holder = None if diverged is None else model.holder(diverged)
    if model.policy == "reuse" and holder is not None:
        model.changed(holder, model.free[holder])  # its count rose


def admit_both(
    pool: BlockPool, model: Model, span: list[bytes], reason: CheckpointReason, tell: bool
) -> None:
    """Ask the policy and its model about a state (twice: asking changes nothing); with `tell`,
    its request is admitted and a refusal is told once. A policy that does not choose
    (`Admits`) writes every state."""
    policy = pool.eviction
    is_asked = isinstance(policy, Admits)
    admitted = policy.admits(span[0], reason, span) if is_asked else True
    assert admitted == model.admits(span[0], reason, span)
    assert not is_asked or policy.admits(span[0], reason, span) == admitted
    if not admitted and tell:
        policy.refused(span[0], reason)
        if model.policy == "reuse":
            model.reuse.refused(span[0], reason)


@pytest.mark.parametrize("policy", list(EVICTION_POLICIES))
@pytest.mark.parametrize("seed", range(12))
def test_each_policy_gives_blocks_up_in_its_models_order(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    holds_states = seed % 2 == 1
    pool = BlockPool(NUM_BLOCKS, BLOCK_SIZE, "g", 0, eviction=policy, holds_states=holds_states)
    model = Model(policy, holds_states)
    attention: dict[bytes, None] = {}  # the keys an attention pool holds, for a coupled one
    gone: list[bytes] = []  # the keys it gave up
    if seed % 4 == 3 and isinstance(pool.eviction, ReadsPrefixes):  # a Mamba pool shown the
        pool.eviction.couple(attention)  # attention pool's keys
        model.attention = attention if policy == "reuse" else None
    support: dict[bytes, int] = {}  # the keys cached states need, for a coupled attention pool
    if seed % 4 == 2 and isinstance(pool.eviction, ReadsSupport):
        pool.eviction.couple_support(support)
        model.reuse.support = support if policy == "reuse" else None
    for block_id in range(NUM_BLOCKS):
        model.add(block_id)
    next_key = 0
    for _ in range(300):
        action, block_id = rng.choice(ACTIONS), rng.randrange(NUM_BLOCKS)
        num, reason = rng.randint(1, 4), rng.choice(REASONS)
        block = pool.blocks[block_id]
        if action == "allocate" and num <= pool.num_free:
            taken = [b.block_id for b in pool.allocate(num)]
            assert taken == model.take(num)
        elif action == "free" and block.ref_cnt:
            pool.free([block_id])
            if not block.ref_cnt:
                model.add(block_id)
        elif action == "touch":
            rank = model.free.pop(block_id, None)
            if policy == "reuse":
                model.reuse.read(rank, block_id)
            pool.touch(block_id)
        elif action == "cache" and not block.keys:  # fresh keys inside one span
            span = rng.randrange(7) * BLOCK_SIZE  # depth and length drawn apart
            keys = [(key_of(next_key + i), span + 1 + i, reason) for i in range(num)]
            next_key += num
            for key, *_ in keys:  # the attention pool mostly holds a state's prefix already
                if rng.random() < 0.8:
                    attention[key] = None
            before = model.free.get(block_id, ())
            pool.cache(block_id, keys, None)
            model.keys[block_id] = {key: (p, why) for key, p, why in keys}
            model.changed(block_id, before)
        elif action == "attention" and (attention or gone):
            if gone and (not attention or rng.random() < 0.5):  # a request computed it again
                key = gone.pop(rng.randrange(len(gone)))
                attention[key] = None
            else:  # the attention pool gives a prefix up
                key = rng.choice(list(attention))
                del attention[key]
                gone.append(key)

        elif action == "observe":  # a request whose chain passes keys, some evicted by now
            draw = rng.random()
            if draw < 0.4:  # a few keys of the chain
                picked = sorted(rng.sample(range(next_key), min(num, next_key)))
            elif draw < 0.8:  # a prefix of it: requests diverging at various depths, some often
                picked = range(rng.randrange(next_key + 1) // 2)
            else:  # the latest keys, often passed by nobody yet: a new family's first request
                picked = range(max(next_key - num, 0), next_key)
            observe_both(pool, model, [key_of(i) for i in picked])
        elif action == "support" and next_key:  # a state past the key is cached, or given up
            key = key_of(rng.randrange(next_key))
            if support.pop(key, None) is None:
                support[key] = rng.randint(1, 3)
            holder = model.holder(key)
            before = model.free.get(holder, ()) if holder is not None else ()
            pool.reorder(key)
            if holder is not None:
                model.changed(holder, before)
        elif action == "admit" and next_key:  # a state about to be written, and the keys after it
            first = rng.randrange(next_key)
            span = [key_of(i) for i in range(first, min(first + num, next_key))]
            admit_both(pool, model, span, reason, tell=rng.random() < 0.5)
        pool.check_invariants()
        assert set(pool.entries) == model.cached()
        assert pool.num_free == len(model.free)


def test_cost_keeps_a_shallow_state_many_requests_passed_over_a_deeper_lone_one() -> None:
    pool = BlockPool(3, BLOCK_SIZE, "mamba", 1, eviction="cost", holds_states=True)
    pool.allocate(3)
    shared, lone = key_of(1), key_of(2)
    pool.cache(0, [(shared, 4, CheckpointReason.BLOCK)], None)  # saves 4 tokens, passed 3 times
    pool.cache(1, [(lone, 8, CheckpointReason.BLOCK)], None)  # saves 8 tokens, passed once
    for _ in range(3):
        pool.eviction.observe([shared])
    pool.eviction.observe([shared, lone])
    pool.free([0, 1, 2])  # priorities 4 * 4 = 16, 8 * 1 = 8, and 0 for the empty block
    assert [b.block_id for b in pool.allocate(3)] == [2, 1, 0]
    assert pool.eviction.clock == 16


def write_request(pool: BlockPool, tail_keys: list[bytes], resume: bytes | None) -> None:
    """A request: resumes from `resume`'s state (held while it runs), writes a `resend` and an
    `extension` state of its own, and finishes (resumed-from first, then the tail freed)."""
    held = [pool.get(resume).block_id] if resume is not None else []
    for block_id in held:
        pool.touch(block_id)
    tails = pool.allocate(2)
    reasons = (CheckpointReason.RESEND, CheckpointReason.EXTENSION)
    for tail, key, why in zip(tails, tail_keys, reasons, strict=True):
        pool.cache(tail.block_id, [(key, 8, why)], None)
    pool.free([*held, *(b.block_id for b in tails)])
    pool.check_invariants()


def test_reuse_keeps_a_state_requests_resumed_from_over_tail_states_nobody_read() -> None:
    """Requests resuming from one shared `block` state alternate with lone ones; each leaves two
    tail states (`resend`, `extension`, retained above `block`) that nobody reads. `retention`
    gives the shared state up to keep the tails; `reuse` learns the tails go unread and keeps
    the state requests resume from."""
    found = {}
    for policy in ("retention", "reuse"):
        pool = BlockPool(5, BLOCK_SIZE, "mamba", 1, eviction=policy, holds_states=True)
        shared, found[policy] = key_of(0), 0
        for round_ in range(1, 13):
            if pool.get(shared) is None:  # a miss recomputes it
                (block,) = pool.allocate(1)
                pool.cache(block.block_id, [(shared, 4, CheckpointReason.BLOCK)], None)
                pool.free([block.block_id])
            else:
                found[policy] += 1
            write_request(pool, [key_of(4 * round_), key_of(4 * round_ + 1)], shared)
            write_request(pool, [key_of(4 * round_ + 2), key_of(4 * round_ + 3)], None)
    assert found["reuse"] == 11  # every round after the first
    assert found["retention"] <= 1


# ------------------------------------------------------------------ (c) an engine under pressure
@pytest.mark.parametrize("policy", list(EVICTION_POLICIES))
def test_a_replay_under_pressure_keeps_every_invariant_with_each_policy(policy: str) -> None:
    from engine.config import CacheConfig, SchedulerConfig
    from engine.engine import Engine
    from engine.traces.replay import replay
    from workloads import build_workload

    workload = build_workload(
        {"kind": "agentic", "num_sessions": 4, "num_steps": 3, "system_prompt_len": 96,
         "task_len": 24, "tool_output_len": 40, "action_len": 8}
    )  # fmt: skip
    cache = CacheConfig(
        block_size=4, mamba_block_size=16, num_blocks=120, num_mamba_blocks=40, eviction=policy
    )
    engine = Engine(cache, SchedulerConfig(max_num_batched_tokens=64), runner="ledger")
    records, summary = replay(engine, workload.items(), 4, on_step=Engine.check_invariants)
    assert all(r["finish_reason"] == "length" for r in records)
    assert summary.num_cached_tokens > 0  # pressure evicts, yet families still hit


# ------------------------------------------------------------------ (d) admission
def test_cost_writes_an_interval_state_only_where_its_prefix_recurred() -> None:
    pool = BlockPool(2, BLOCK_SIZE, "mamba", 1, eviction="cost", holds_states=True)
    policy = pool.eviction
    shared, lone = key_of(1), key_of(2)
    interval = CheckpointReason.INTERVAL
    assert policy.admits(lone, interval)  # the next block holds nothing: a spare is free
    (block,) = pool.allocate(1)
    pool.cache(block.block_id, [(key_of(3), 4, CheckpointReason.BLOCK)], None)
    pool.free([block.block_id])
    pool.allocate(1)  # the empty block: the cached one is next to go
    policy.observe([shared, lone])  # the writer's own chain
    policy.observe([shared])  # another request passed `shared` only
    assert policy.admits(shared, interval)
    assert not policy.admits(lone, interval)
    assert policy.admits(lone, CheckpointReason.JUNCTION)  # only interval states are tested
    for name in EVICTION_POLICIES:  # every other policy admits every state
        if name != "cost":
            other = BlockPool(1, BLOCK_SIZE, "m", 1, eviction=name).eviction
            assert not isinstance(other, Admits) or other.admits(lone, interval)


# ------------------------------------------------------------------ choosing a policy
def test_the_flag_and_the_bench_geometry_choose_a_policy_and_name_the_known_ones(capsys) -> None:
    import argparse

    from pydantic import ValidationError

    from bench.spec import EngineSettings
    from engine.setup.options import add_cache_options

    parser = argparse.ArgumentParser()
    add_cache_options(parser)
    assert parser.parse_args(["--eviction", "cost"]).eviction == "cost"
    with pytest.raises(SystemExit):
        parser.parse_args(["--eviction", "nope"])
    assert "--eviction: invalid choice: 'nope'" in capsys.readouterr().err
    assert EngineSettings(eviction="lru").cache_config().eviction == "lru"
    with pytest.raises(ValidationError, match=r"eviction\n.*unknown eviction policy 'nope'"):
        EngineSettings(eviction="nope")


# ------------------------------------------------------------------ (d) which states are written
def test_reuse_refuses_a_state_every_sibling_passes_and_admits_it_once_one_diverges_there() -> None:
    """Siblings share `a0..a3` and part after `a3`: the state at `a1` serves nobody (each
    resumes from `a3`'s), so it is refused, `a3`'s admitted; once a request diverges after
    `a1`, the state at `a1` is worth writing again."""
    policy = BlockPool(4, BLOCK_SIZE, "mamba", 1, eviction="reuse", holds_states=True).eviction
    prefix = [key_of(i) for i in range(4)]
    block = CheckpointReason.BLOCK
    policy.observe([*prefix, key_of(10)])
    assert policy.admits(prefix[1], block, prefix[1:3])  # a new prefix: its class decides
    policy.observe([*prefix, key_of(11)])
    assert not policy.admits(prefix[1], block, prefix[1:3])
    assert policy.admits(prefix[3], block, prefix[3:])
    assert policy.admits(prefix[1], CheckpointReason.JUNCTION, prefix[1:3])  # nothing to lose
    policy.observe([*prefix[:2], key_of(12)])  # diverges right after `a1`
    assert policy.admits(prefix[1], block, prefix[1:3])


def test_reuse_writes_no_state_that_would_go_before_the_cached_state_it_displaces() -> None:
    """Five families of 8 siblings ended at 7 divergences each; family `x` has had 1 (5 more
    expected), family `y` 6 (5/6 more). With `x`'s state cached and free, a junction state for
    `y` would rank below it, so writing it would give up the state worth more: refused; so is
    a tail state of a new prefix, whose class ranks low. Not refused: anything while an empty
    block is the only one left, the first `block` or junction state of a new prefix, and
    anything once `x`'s state is an orphan (its attention prefix gone)."""
    pool = BlockPool(2, BLOCK_SIZE, "mamba", 1, eviction="reuse", holds_states=True)
    policy, junction = pool.eviction, CheckpointReason.JUNCTION
    attention: dict[bytes, None] = {}
    policy.couple(attention)
    siblings_of = [8] * 5 + [2, 7]  # the five finished families, `x`, `y`
    for index, siblings in enumerate(siblings_of):
        prefix = [key_of(1000 * index + i) for i in range(4)]
        for sibling in range(siblings):
            policy.observe([*prefix, key_of(1000 * index + 100 + sibling)])
            attention |= dict.fromkeys(prefix)
    x, y, new = key_of(5003), key_of(6003), key_of(9000)
    assert policy.divergence.expected_at(policy.divergence.ends(x)) == pytest.approx(5.0)
    assert policy.divergence.expected_at(policy.divergence.ends(y)) == pytest.approx(5 / 6)
    policy.observe([new])
    assert policy.admits(y, junction, [y])  # no cached state to lose yet
    (block,) = pool.allocate(1)
    pool.cache(block.block_id, [(x, 16, junction)], None)
    pool.free([block.block_id])
    assert not policy.admits(y, junction, [y])
    assert not policy.admits(new, CheckpointReason.RESEND, [new])
    assert policy.admits(new, CheckpointReason.BLOCK, [new])
    assert policy.admits(key_of(9001), junction, [key_of(9001)])  # nobody passed it
    assert policy.admits(x, junction, [x])  # worth as much as the one it displaces
    del attention[x]
    assert policy.admits(y, junction, [y])  # the state it displaces serves no hit


def test_reuse_gives_up_its_newest_unread_tail_state_first_while_tails_are_read() -> None:
    """Three sessions' tail states (`extension`), freed in turn: while the class is read at
    least `NEWEST_FIRST_RATE` of the time an allocation gives up the newest, since sessions
    come round in turn and the oldest is the one a next turn reads first; once the class is
    read less (given up unread 100 times), the oldest, so stale tails do not stay."""
    extension = CheckpointReason.EXTENSION
    klass = unread_class(extension)
    for is_read_seldom, expected in ((False, 2), (True, 0)):
        pool = BlockPool(3, BLOCK_SIZE, "mamba", 1, eviction="reuse", holds_states=True)
        if is_read_seldom:
            for round_ in range(100):
                pool.eviction.rates.evicted(klass, key_of(500 + round_))
        blocks = pool.allocate(3)
        for n, block in enumerate(blocks):
            pool.cache(block.block_id, [(key_of(n), 16, extension)], None)
        pool.free([block.block_id for block in blocks])  # the first freed is the oldest
        (taken,) = pool.allocate(1)
        assert taken.block_id == blocks[expected].block_id
        pool.check_invariants()


def test_reuse_keeps_a_new_familys_block_state_over_one_past_a_shared_prefix() -> None:
    """A `block` state of a prompt that shared nothing with earlier ones (a new family's first
    request: its siblings could resume only from it) has a class of its own, starting at the
    tail states' prior; one past a prefix shared with earlier prompts (an agent's own task
    after the common system prompt) stays a plain `block` state and goes first, though freed
    later."""
    pool = BlockPool(3, BLOCK_SIZE, "mamba", 1, eviction="reuse", holds_states=True)
    policy, block = pool.eviction, CheckpointReason.BLOCK
    family = [key_of(i) for i in range(4)]  # a new family
    policy.observe(family)
    policy.observe([key_of(10), key_of(11)])  # a system prompt, then a session past it
    session = [key_of(10), key_of(11), key_of(12), key_of(13)]
    policy.observe(session)
    assert policy.divergence.is_root(family[3]) and not policy.divergence.is_root(session[3])
    root, plain = pool.allocate(2)
    pool.cache(root.block_id, [(family[3], 16, block)], None)
    pool.cache(plain.block_id, [(session[3], 16, block)], None)
    pool.free([root.block_id])
    pool.free([plain.block_id])
    assert policy.klass(root) == ROOT and policy.klass(plain) == unread_class(block)
    pool.allocate(1)  # the empty block
    assert pool.allocate(1) == [plain]
    pool.check_invariants()


def test_reuse_refuses_tail_states_of_a_class_nobody_reads_and_learns_it_back() -> None:
    """`extension` states evicted unread bring their class below `ADMIT_RATE`, so a new one is
    refused; requests that would have resumed from refused ones raise the class again."""
    pool = BlockPool(3, BLOCK_SIZE, "mamba", 1, eviction="reuse", holds_states=True)
    policy, extension = pool.eviction, CheckpointReason.EXTENSION
    klass = unread_class(extension)
    round_ = 0

    def admitted(key: bytes) -> bool:
        """Ask twice, as a waiting request may, then admit its request: told once."""
        answer = policy.admits(key, extension, [key])
        assert policy.admits(key, extension, [key]) == answer
        if not answer:
            policy.refused(key, extension)
        return answer

    while admitted(key_of(1000 + round_)):
        (tail,) = pool.allocate(1)
        pool.cache(tail.block_id, [(key_of(round_), 8, extension)], None)
        pool.free([tail.block_id])
        round_ += 1
        assert round_ < 200
    assert policy.rates.rate(klass) < ADMIT_RATE
    refused = key_of(1000 + round_)
    assert refused in policy.rates.ghosts
    for turn in range(200):
        policy.observe([refused, key_of(5000 + turn)])  # a next turn would have resumed there
        if admitted(key_of(2000 + turn)):
            break
        refused = key_of(2000 + turn)
    else:
        raise AssertionError("the class never learnt that its states were read")
    assert policy.rates.rate(klass) >= ADMIT_RATE


def shared_prompt_checkpoints(policy: str, num_mamba_blocks: int) -> list[tuple[str, list[int]]]:
    """Each request's family and the states it registered (4 families of 4 siblings: a 64-token
    system prompt, 8-token questions; `Bm` 16), run one at a time on the ledger runner, which
    checks every read."""
    from engine.config import CacheConfig, SchedulerConfig
    from engine.engine import Engine
    from engine.traces.replay import replay
    from workloads import build_workload

    workload = build_workload(
        {"kind": "generated_shared_prefix", "num_groups": 4, "prompts_per_group": 4,
         "system_prompt_len": 64, "question_len": 8, "output_len": 2}
    )  # fmt: skip
    cache = CacheConfig(
        block_size=4,
        mamba_block_size=16,
        prefix_match_unit=4,
        num_blocks=400,
        num_mamba_blocks=num_mamba_blocks,
        eviction=policy,
    )
    engine = Engine(cache, SchedulerConfig(), runner="ledger")
    items = workload.items()
    records, _ = replay(engine, items, 1, on_step=Engine.check_invariants)
    families = [item.request_id.split("-")[0] for item in items]
    return [(family, r["checkpoints"]) for family, r in zip(families, records, strict=True)]


def test_under_pressure_reuse_writes_only_the_states_siblings_resume_from() -> None:
    """Under pressure a sibling that misses writes the system prompt's end (where its family
    diverges) but not the block states before it; the first of a family, whose prompt nobody
    passed before, writes them all; with room for everything every request writes what
    `retention` writes."""
    seen, later = set(), []
    for family, written in shared_prompt_checkpoints("reuse", 10):
        if family in seen and 64 in written:
            later.append(written)
        elif family not in seen:
            assert {16, 32, 48, 64} <= set(written)
        seen.add(family)
    assert later and all(not {16, 32, 48} & set(written) for written in later)
    assert shared_prompt_checkpoints("reuse", 200) == shared_prompt_checkpoints("retention", 200)


def small_coordinator(num_mamba_blocks: int):
    """A coordinator with `Ba` 4, `Bm` 16, `U` 4, 64 attention blocks and `num_mamba_blocks`
    state slots."""
    from engine.cache.coordinator import HybridCoordinator
    from engine.config import CacheConfig
    from engine.events import NullSink

    config = CacheConfig(block_size=4, mamba_block_size=16, prefix_match_unit=4, num_blocks=64,
                         num_mamba_blocks=num_mamba_blocks)  # fmt: skip
    return HybridCoordinator(config, NullSink())


def cache_others(coordinator, num: int) -> None:
    """`num` of the Mamba pool's blocks come to hold other prompts' `block` states, free."""
    pool = coordinator.mamba.pool
    for block in pool.allocate(num):
        pool.cache(block.block_id, [(key_of(200 + block.block_id), 16, CheckpointReason.BLOCK)],
                   None)  # fmt: skip
        pool.free([block.block_id])


def test_states_are_asked_about_only_while_the_pool_has_no_spare_block_for_each() -> None:
    """A sibling's block state before the family's junction is refused under pressure, and
    written while the Mamba pool has an empty block for every state the prompt writes."""
    coordinator = small_coordinator(6)
    prefix = [key_of(i) for i in range(8)]  # 32 shared tokens, then each request's own 8
    for question in (100, 101):
        coordinator.observe([*prefix, key_of(question), key_of(question + 10)])
    chain = [*prefix, key_of(102), key_of(112)]
    coordinator.observe(chain)
    targets = {32: CheckpointReason.JUNCTION}
    assert coordinator.refused_states(chain, 40, 0, targets) == frozenset()  # 6 empty blocks
    cache_others(coordinator, 4)  # 4 of the 6 blocks hold others' states, free
    assert coordinator.refused_states(chain, 40, 0, targets) == {16}
    assert coordinator.refused_states(chain, 40, 16, targets) == frozenset()  # above the hit only


def test_under_pressure_a_message_state_just_below_a_written_state_is_refused() -> None:
    """A chat's last message ends at 32 and its `resend` state lies one unit past it, at 36:
    under pressure `reuse` writes the `resend` state, which serves every request that passes
    36, and not the message state (nor counts it as given up: its class holds the system
    prompts' states). The message state is written when the next state lies two units past
    it, when the `resend` state is refused, and once a request has diverged between the two."""
    chain = [key_of(i) for i in range(10)]
    targets = {32: CheckpointReason.MESSAGE, 36: CheckpointReason.RESEND}
    coordinator = small_coordinator(6)
    cache_others(coordinator, 4)  # a request writing 3 states is under pressure
    policy = coordinator.mamba.pool.eviction
    coordinator.observe(chain)
    assert coordinator.refused_states(chain, 40, 0, targets) == {32}
    coordinator.tell_refused(chain, {32}, targets)
    assert chain[7] not in policy.rates.ghosts
    far = {32: CheckpointReason.MESSAGE, 40: CheckpointReason.RESEND}
    assert coordinator.refused_states(chain, 40, 0, far) == frozenset()
    coordinator.observe([*chain[:8], key_of(99)])  # diverges between 32 and 36
    assert 32 not in coordinator.refused_states(chain, 40, 0, targets)

    coordinator = small_coordinator(6)
    cache_others(coordinator, 4)  # a request writing 3 states is under pressure
    policy = coordinator.mamba.pool.eviction
    coordinator.observe(chain)
    resend = unread_class(CheckpointReason.RESEND)
    for round_ in range(100):  # resend states given up unread: the class is refused
        policy.rates.evicted(resend, key_of(500 + round_))
    assert coordinator.refused_states(chain, 40, 0, targets) == {36}


def test_reuse_asks_a_message_state_the_request_goes_past_its_rank() -> None:
    """A chat turn's earlier message state (the request writes its next state two units past
    it or more) whose prefix is new is asked its rank, as a tail state of a new prefix: with
    its class seldom read (given up unread 100 times) it would go before the system prompt's
    cached state, so it is refused. Written: a new family's own (the first prompt's), any once
    that cached state is an orphan, and the turn's once a request diverged past it."""
    pool = BlockPool(2, BLOCK_SIZE, "mamba", 1, eviction="reuse", holds_states=True)
    policy, message = pool.eviction, CheckpointReason.MESSAGE
    attention: dict[bytes, None] = {}
    policy.couple(attention)
    system = [key_of(i) for i in range(4)]
    first, turn = [*system, *map(key_of, (10, 11, 12))], [*system, *map(key_of, (20, 21, 22))]
    policy.observe(first)
    policy.observe(turn)
    attention |= dict.fromkeys([*first, *turn])
    (block,) = pool.allocate(1)
    pool.cache(block.block_id, [(system[3], 16, CheckpointReason.JUNCTION)], None)
    pool.free([block.block_id])
    message_class = unread_class(message)
    for round_ in range(100):
        policy.rates.evicted(message_class, key_of(500 + round_))
    assert not policy.admits(turn[4], message, turn[4:6])
    assert not policy.admits(turn[4], message, turn[4:5])  # the next state within a unit
    assert policy.admits(first[4], message, first[4:6])  # a new family's
    del attention[system[3]]
    assert policy.admits(turn[4], message, turn[4:6])  # it displaces an orphan
    attention[system[3]] = None
    policy.observe([*turn[:5], key_of(99)])  # diverges at its key
    assert policy.admits(turn[4], message, turn[4:6])


def test_a_prompt_that_parts_from_its_siblings_branches_and_one_extending_the_last_does_not():
    """Where a prompt diverged is a branch when an earlier prompt went on past it (siblings
    part there: a state there serves the ones that follow), not when every earlier prompt
    that passed it ended there (a next turn extending the last one's prompt)."""
    from engine.cache.eviction.divergence import DivergenceCounts

    counts = DivergenceCounts()
    turn = [key_of(i) for i in range(4)]
    assert counts.observe(turn) is None  # nobody passed its first hash
    assert counts.observe([*turn, key_of(4), key_of(5)]) == (key_of(3), 4, False)  # extends it
    assert counts.observe([*turn, key_of(6)]) == (key_of(3), 4, True)  # the second went on
    assert counts.observe(turn[:2]) == (key_of(1), 2, True)  # ends where the others went on


def test_a_waiting_request_asked_again_and_again_teaches_its_refusals_once() -> None:
    """A new prompt whose tail class is read below `ADMIT_RATE` is refused its `extension`
    state; asking at each admission attempt learns nothing, and admitting its request counts
    the refusal once, as a ghost a later request may raise the class from."""
    coordinator = small_coordinator(2)
    policy, extension = coordinator.mamba.pool.eviction, CheckpointReason.EXTENSION
    klass = unread_class(extension)
    for round_ in range(100):  # tail states given up unread
        policy.rates.evicted(klass, key_of(500 + round_))
    chain = [key_of(i) for i in range(10)]  # 40 tokens nobody passed: states at 16, 32, 40
    coordinator.observe(chain)
    targets = {40: extension}
    departures = list(policy.rates.departures)
    for _ in range(5):  # a waiting request, asked at each step
        assert 40 in coordinator.refused_states(chain, 40, 0, targets)
    assert policy.rates.departures == departures
    coordinator.tell_refused(chain, {40}, targets)
    departures[klass] += 1
    assert policy.rates.departures == departures and key_of(9) in policy.rates.ghosts


def test_divergence_counts_expect_as_many_more_siblings_as_finished_families_had() -> None:
    """Five families of 8 siblings, then one with 2 so far: its key has had 1 divergence (the
    second sibling), and finished families went on to 7, so 5 more are expected; a key at 7 is
    past what any family reached, so nothing is claimed. Past `max_keys` the older generation of
    hashes is forgotten, their divergences with them, but a hash passed again moved on."""
    from engine.cache.eviction.divergence import DivergenceCounts

    counts = DivergenceCounts()
    for family in range(6):
        prefix = [key_of(1000 * family + i) for i in range(4)]
        for sibling in range(8 if family < 5 else 2):
            counts.observe([*prefix, key_of(1000 * family + 100 + sibling)])
    assert counts.ends(key_of(5003)) == 1 and counts.ends(key_of(3)) == 7
    assert counts.expected_at(1) == pytest.approx(5.0)
    assert counts.expected_at(7) is None  # nobody went further
    assert counts.expected_at(counts.ends(key_of(5002))) is None  # nobody diverged there
    assert counts.diverged_within([key_of(3), key_of(2)]) == 7
    assert counts.count(key_of(3)) == 8

    small = DivergenceCounts(max_keys=6)  # generations of 3 hashes
    small.observe([key_of(1), key_of(2), key_of(3)])
    # 4 hashes: a new one; the first prompt went on past `key_of(2)`: a branch
    assert small.observe([key_of(1), key_of(2), key_of(4)]) == (key_of(2), 2, True)
    small.observe([key_of(7), key_of(8), key_of(9)])
    assert small.count(key_of(3)) == 1 and small.count(key_of(1)) == 2  # the older generation
    # passed again, `key_of(1)` moves on; 5 hashes: `key_of(2..4)`'s generation is forgotten
    assert small.observe([key_of(1), key_of(10)]).key == key_of(1)
    assert small.count(key_of(2)) == 0 and small.ends(key_of(2)) == 0
    assert small.count(key_of(1)) == 3  # it had moved to the generation that stays
    # the first prompt shared nothing: its hashes are a new family's; forgotten with them
    assert small.is_root(key_of(1)) and small.is_root(key_of(7)) and not small.is_root(key_of(2))


def branch_run(policy: str) -> dict[str, dict]:
    """A family's first request, then prompts of their own until the attention pool has given
    its prefix up, then two siblings: the first finds no junction in the attention match. The
    family's prefix is 40 tokens (`Bm` 16: no block state there). Ledger runner, one at a time,
    every read checked."""
    from engine.config import CacheConfig, SchedulerConfig
    from engine.engine import Engine
    from engine.traces.replay import replay
    from engine.traces.trace import TraceRequest, segment_tokens

    prefix = segment_tokens(1, 40)
    prompts = {"a": prefix + segment_tokens(2, 8)}
    prompts |= {f"other{i}": segment_tokens(10 + i, 48) for i in range(6)}
    prompts |= {"b": prefix + segment_tokens(3, 8), "c": prefix + segment_tokens(4, 8)}
    items = [
        TraceRequest(line, name, tokens, 2, None, 0.0, 1.0, 0)
        for line, (name, tokens) in enumerate(prompts.items())
    ]
    cache = CacheConfig(block_size=4, mamba_block_size=16, prefix_match_unit=4, num_blocks=40,
                        num_mamba_blocks=64, eviction=policy)  # fmt: skip
    engine = Engine(cache, SchedulerConfig(), runner="ledger")
    records, _ = replay(engine, items, 1, on_step=Engine.check_invariants)
    return {record["id"]: record for record in records}


def test_a_sibling_whose_prefix_the_attention_pool_gave_up_still_keeps_the_branch_state() -> None:
    """`reuse` learnt that the family's prompts part at 40, so `b`, which finds no junction
    (the attention pool gave the prefix up), writes the state there and `c` hits it; under
    `retention` `b` writes only the block states and `c` hits 32."""
    learnt, fixed = branch_run("reuse"), branch_run("retention")
    for run in (learnt, fixed):
        assert run["b"]["num_cached_tokens"] == 0  # the attention prefix was given up
    assert 40 in learnt["b"]["checkpoints"] and learnt["c"]["num_cached_tokens"] == 40
    assert 40 not in fixed["b"]["checkpoints"] and fixed["c"]["num_cached_tokens"] == 32
