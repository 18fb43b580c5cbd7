"""Eviction policies: the registry, and the default policy against an independent model."""

from __future__ import annotations

import random

import pytest

from engine.cache.block import Block, InvariantError
from engine.cache.block_pool import BlockPool
from engine.cache.entry import RETENTION, CheckpointReason, Entry
from engine.cache.eviction import DEFAULT_EVICTION, EVICTION_POLICIES, make_policy, policy_class
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.retention import NUM_FREE_LEVELS, RetentionLRU
from engine.cache.eviction.reuse import ReuseLearned


def test_the_registry_lists_the_default_policy_first_by_its_name() -> None:
    assert DEFAULT_EVICTION == "reuse" == next(iter(EVICTION_POLICIES))
    assert issubclass(policy_class(DEFAULT_EVICTION), ReuseLearned)
    for name, where in EVICTION_POLICIES.items():
        policy = policy_class(name)
        assert issubclass(policy, EvictionPolicy)
        assert where == f"{policy.__module__.rpartition('.')[2]}:{policy.__name__}"


def test_an_unknown_policy_is_a_value_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy 'nope'") as error:
        make_policy("nope", [], {})
    assert all(name in str(error.value) for name in EVICTION_POLICIES)
    with pytest.raises(ValueError, match="retention"):
        BlockPool(4, 4, "attention", 0, eviction="nope")


def test_a_pool_builds_the_policy_it_names_with_every_block_free() -> None:
    pool = BlockPool(4, 4, "attention", 0, eviction="retention")
    assert isinstance(pool.eviction, RetentionLRU)
    assert pool.eviction.num_free == 4
    assert [b.block_id for b in pool.eviction.take(2)] == [0, 1]


class Model:
    """Free blocks as (level, time freed): taken lowest level first, then oldest first."""

    def __init__(self) -> None:
        self.free: dict[int, tuple[int, int]] = {}
        self.clock = 0

    def add(self, block_id: int, level: int) -> None:
        self.clock += 1
        self.free[block_id] = (level, self.clock)

    def take(self, num: int) -> list[int]:
        order = sorted(self.free, key=lambda b: self.free[b])[:num]
        for block_id in order:
            del self.free[block_id]
        return order


def level_of(reasons: list[CheckpointReason]) -> int:
    return min(max((RETENTION[r] for r in reasons), default=0), NUM_FREE_LEVELS - 1)


@pytest.mark.parametrize("seed", range(20))
def test_retention_lru_gives_blocks_up_in_the_models_order(seed: int) -> None:
    rng = random.Random(seed)
    blocks = [Block(i) for i in range(12)]
    entries: dict[bytes, Entry] = {}
    policy, model = RetentionLRU(blocks, entries), Model()
    reasons: dict[int, list[CheckpointReason]] = {b.block_id: [] for b in blocks}
    for block in blocks:
        policy.add(block)
        model.add(block.block_id, 0)
    held: set[int] = set()
    for step in range(200):
        action = rng.random()
        free = sorted(set(reasons) - held)
        if action < 0.3 and free:  # hold a free block again
            block_id = rng.choice(free)
            policy.remove(blocks[block_id])
            del model.free[block_id]
            held.add(block_id)
        elif action < 0.6 and held:  # free a held block
            block_id = rng.choice(sorted(held))
            held.remove(block_id)
            policy.add(blocks[block_id])
            model.add(block_id, level_of(reasons[block_id]))
        elif action < 0.85:  # a new entry on any block, held or free
            block_id = rng.randrange(len(blocks))
            reason = rng.choice([r for r in CheckpointReason if r is not CheckpointReason.PIN])
            key = step.to_bytes(16, "big")
            entries[key] = Entry(key, block_id, 1, reason)
            blocks[block_id].keys.append(key)
            # the pool's part: the block's stored retention follows its entries
            blocks[block_id].retention = max(blocks[block_id].retention, RETENTION[reason])
            before = level_of(reasons[block_id])
            reasons[block_id].append(reason)
            policy.update(blocks[block_id])
            if block_id in model.free and level_of(reasons[block_id]) != before:
                model.add(block_id, level_of(reasons[block_id]))
        else:  # allocate: the policy gives up the model's blocks, entries dropped after
            num = rng.randint(0, policy.num_free)
            taken = [b.block_id for b in policy.take(num)]
            assert taken == model.take(num)
            for block_id in taken:
                held.add(block_id)
                for key in blocks[block_id].keys:
                    del entries[key]
                blocks[block_id].keys = []
                blocks[block_id].retention = 0
                reasons[block_id] = []
        policy.check_invariants()
        assert policy.num_free == len(model.free)
        interval = RETENTION[CheckpointReason.INTERVAL]
        assert policy.num_free_up_to(interval) == sum(
            1 for level, _ in model.free.values() if level <= interval
        )


def test_check_invariants_names_a_block_whose_level_is_stale() -> None:
    blocks = [Block(0), Block(1)]
    entries: dict[bytes, Entry] = {}
    policy = RetentionLRU(blocks, entries)
    policy.add(blocks[0])
    policy.add(blocks[1])
    key = b"k" * 16
    entries[key] = Entry(key, 1, 1, CheckpointReason.JUNCTION)
    blocks[1].keys.append(key)  # changed behind the policy's back: no update()
    blocks[1].retention = RETENTION[CheckpointReason.JUNCTION]
    with pytest.raises(InvariantError, match=r"block 1\b.*level 0 is stale"):
        policy.check_invariants()


def test_check_invariants_names_a_block_whose_stored_retention_disagrees() -> None:
    blocks = [Block(0), Block(1)]
    entries: dict[bytes, Entry] = {}
    policy = RetentionLRU(blocks, entries)
    key = b"k" * 16
    entries[key] = Entry(key, 1, 1, CheckpointReason.JUNCTION)
    blocks[1].keys.append(key)  # the pool's stored retention not raised with it
    policy.add(blocks[0])
    policy.add(blocks[1])
    with pytest.raises(InvariantError, match=r"block 1: stored retention 0 .* 4"):
        policy.check_invariants()


def test_the_cache_config_names_a_policy_its_pools_use() -> None:
    from engine.cache.coordinator import HybridCoordinator
    from engine.config import CacheConfig
    from engine.events import NullSink

    coordinator = HybridCoordinator(CacheConfig(num_blocks=8), NullSink())
    assert all(isinstance(p.eviction, ReuseLearned) for p in coordinator.pools.values())
    chosen = HybridCoordinator(CacheConfig(num_blocks=8, eviction="retention"), NullSink())
    assert all(isinstance(p.eviction, RetentionLRU) for p in chosen.pools.values())
    with pytest.raises(ValueError, match="unknown eviction policy 'nope': choose one of reuse"):
        CacheConfig(eviction="nope")


def test_importing_the_config_loads_no_policy() -> None:
    """The registry names the policies without loading them: the config checks a name, a pool
    loads the one it names."""
    import subprocess
    import sys

    code = (
        "import sys, engine.config\n"
        "print(sorted(m for m in sys.modules if m.startswith('engine.cache.eviction.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_reuse_classes_follow_the_reasons_unread_then_read() -> None:
    from engine.cache.eviction.reuse_places import REASON_CLASS, ReuseClass

    for index, reason in enumerate(CheckpointReason):
        assert REASON_CLASS[reason] == 1 + 2 * index
        assert ReuseClass(REASON_CLASS[reason] + 1).name == f"{reason.name}_READ"
    assert ReuseClass.ROOT == 1 + 2 * len(CheckpointReason)
