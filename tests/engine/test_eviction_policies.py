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
from engine.cache.eviction.reuse import ATTENTION_HORIZON_PER_BLOCK, STATE_HORIZON_PER_BLOCK
from engine.cache.eviction.reuse_rates import GHOSTS_PER_BLOCK, PRIOR

NUM_BLOCKS = 10
BLOCK_SIZE = 4
REASONS = [r for r in CheckpointReason if r is not CheckpointReason.PIN]


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
        elif action == "observe":
            pool.eviction.observe([key_of(i) for i in range(num + block_id)])
        pool.check_invariants()
        assert pool.num_free == sum(1 for b in pool.blocks if not b.ref_cnt and not b.pin_cnt)


# ------------------------------------------------------------------ (b) each policy's model
class ReuseModel:
    """`reuse` from its docstring: free blocks as (class, stamp), the class a reason's place in
    `CheckpointReason` and whether the block was read while cached; per class hits and
    departures; ghosts of evicted deepest keys, FIFO; priority `stamp + rate * horizon`."""

    def __init__(self, holds_states: bool) -> None:
        self.holds_states = holds_states
        per_block = STATE_HORIZON_PER_BLOCK if holds_states else ATTENTION_HORIZON_PER_BLOCK
        self.horizon = per_block * NUM_BLOCKS
        self.stamp = 0
        self.is_read: set[int] = set()
        self.hits: Counter[int] = Counter()
        self.departures: Counter[int] = Counter()
        self.ghosts: dict[bytes, int] = {}  # insertion order is eviction order

    def klass(self, entries: dict[bytes, tuple[int, CheckpointReason]], block_id: int) -> int:
        if not entries:
            return 0
        reasons = [why for _, why in entries.values()]
        best = next(why for why in reasons if RETENTION[why] == max(map(RETENTION.get, reasons)))
        return 1 + 2 * list(CheckpointReason).index(best) + (block_id in self.is_read)

    def rate(self, klass: int) -> float:
        top = RETENTION[CheckpointReason.PIN] + 1
        reason = list(CheckpointReason)[(klass - 1) // 2]
        prior = (RETENTION[reason] + 0.5 * ((klass - 1) % 2)) / top
        return (self.hits[klass] + PRIOR * prior) / (self.departures[klass] + PRIOR)

    def rank(self, entries: dict, block_id: int) -> tuple:
        if not entries:
            self.is_read.discard(block_id)
        self.stamp += 1
        return (self.klass(entries, block_id), self.stamp)

    def read(self, rank: tuple | None, block_id: int) -> None:
        if rank is not None and rank[0]:
            self.hits[rank[0]] += 1
            self.departures[rank[0]] += 1
            self.is_read.add(block_id)

    def next_block(self, free: dict[int, tuple]) -> int:
        def priority(block_id: int) -> tuple:
            klass, stamp = free[block_id]
            return (-1.0 if not klass else stamp + self.rate(klass) * self.horizon, klass, stamp)

        return min(free, key=priority)

    def evicted(self, rank: tuple, block_id: int, entries: dict) -> None:
        self.is_read.discard(block_id)
        if rank[0]:
            self.departures[rank[0]] += 1
            deepest = max(entries, key=lambda key: entries[key][0])
            self.ghosts.pop(deepest, None)
            self.ghosts[deepest] = rank[0]
            if len(self.ghosts) > GHOSTS_PER_BLOCK * NUM_BLOCKS:
                del self.ghosts[next(iter(self.ghosts))]

    def observe(self, hashes: list[bytes], cached: set[bytes]) -> None:
        for key in reversed(hashes):
            if key in cached:
                return
            if key in self.ghosts:
                self.hits[self.ghosts.pop(key)] += 1
                if self.holds_states:
                    return


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
            moved = self.reuse.klass(self.keys.get(block_id, {}), block_id) != before[0]
        else:
            moved = self.policy == "retention" and self.rank(block_id)[0] != before[0]
        if self.policy == "cost" or moved:
            self.free[block_id] = self.rank(block_id)

    def take(self, num: int) -> list[int]:
        if self.policy == "reuse":  # one take learns from its evictions once it is done
            ranks = {}
            for _ in range(num):
                block_id = self.reuse.next_block(self.free)
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


ACTIONS = ["allocate"] * 3 + ["free"] * 3 + ["touch", "cache", "cache", "observe"]


@pytest.mark.parametrize("policy", list(EVICTION_POLICIES))
@pytest.mark.parametrize("seed", range(12))
def test_each_policy_gives_blocks_up_in_its_models_order(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    holds_states = seed % 2 == 1
    pool = BlockPool(NUM_BLOCKS, BLOCK_SIZE, "g", 0, eviction=policy, holds_states=holds_states)
    model = Model(policy, holds_states)
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
            model.reuse.read(model.free.pop(block_id, None), block_id)
            pool.touch(block_id)
        elif action == "cache" and not block.keys:  # fresh keys inside one span
            span = rng.randrange(7) * BLOCK_SIZE  # depth and length drawn apart
            keys = [(key_of(next_key + i), span + 1 + i, reason) for i in range(num)]
            next_key += num
            before = model.free.get(block_id, ())
            pool.cache(block_id, keys, None)
            model.keys[block_id] = {key: (p, why) for key, p, why in keys}
            model.changed(block_id, before)
        elif action == "observe":  # a request whose chain passes keys, some evicted by now
            hashes = [key_of(i) for i in sorted(rng.sample(range(next_key), min(num, next_key)))]
            pool.eviction.observe(hashes)
            model.counts.update(hashes)
            model.reuse.observe(hashes, model.cached())
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
    from engine.replay import replay
    from engine.workloads import build_workload

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
    for name in EVICTION_POLICIES:
        if name != "cost":
            assert BlockPool(1, BLOCK_SIZE, "m", 1, eviction=name).eviction.admits(lone, interval)


# ------------------------------------------------------------------ choosing a policy
def test_the_flag_and_the_bench_geometry_choose_a_policy_and_name_the_known_ones(capsys) -> None:
    import argparse

    from pydantic import ValidationError

    from engine.bench.spec import EngineSettings
    from engine.options import add_cache_options

    parser = argparse.ArgumentParser()
    add_cache_options(parser)
    assert parser.parse_args(["--eviction", "cost"]).eviction == "cost"
    with pytest.raises(SystemExit):
        parser.parse_args(["--eviction", "nope"])
    assert "--eviction: invalid choice: 'nope'" in capsys.readouterr().err
    assert EngineSettings(eviction="lru").cache_config().eviction == "lru"
    with pytest.raises(ValidationError, match=r"eviction\n.*unknown eviction policy 'nope'"):
        EngineSettings(eviction="nope")
