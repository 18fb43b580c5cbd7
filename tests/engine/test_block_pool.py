"""BlockPool: reference counts, the LRU free queue by retention level, pins, entries, events."""

from __future__ import annotations

import pytest

from engine.cache.block_pool import BlockPool, InvariantError, NoFreeBlocksError
from engine.cache.entry import CheckpointReason
from engine.events import BlockHashesMoved, BlockRemoved, BlockStored, ListSink

BLOCK = CheckpointReason.BLOCK
RESEND = CheckpointReason.RESEND
JUNCTION = CheckpointReason.JUNCTION
PIN = CheckpointReason.PIN

BLOCK_SIZE = 4


@pytest.fixture
def sink() -> ListSink:
    return ListSink()


@pytest.fixture
def make_pool(sink: ListSink):
    def make(num_blocks: int = 4, block_size: int = BLOCK_SIZE) -> BlockPool:
        # the retention policy, whose order (docs/rules.md section 12) these tests spell out
        return BlockPool(num_blocks, block_size, "attention", 0, sink, eviction="retention")

    return make


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def cache_at(
    pool: BlockPool,
    block_id: int,
    index: int,
    reason: CheckpointReason = BLOCK,
    name: int | None = None,
) -> list[bytes]:
    """Register one full entry, `key(name)` (default `key(1000 + block_id)`), on `block_id` as
    the `index`-th block of a table."""
    name = 1000 + block_id if name is None else name
    position = (index + 1) * pool.block_size
    return pool.cache(block_id, [(key(name), position, reason)], None)


def allocate_ids(pool: BlockPool, num: int) -> list[int]:
    return [block.block_id for block in pool.allocate(num)]


def removed_ids(sink: ListSink) -> list[int]:
    return [i for event in sink.drain() if isinstance(event, BlockRemoved) for i in event.block_ids]


# ------------------------------------------------------------------ reference counts


def test_fresh_pool_is_all_free(make_pool) -> None:
    pool = make_pool(4)
    assert pool.num_free == 4
    assert all(pool.is_free(i) and pool.blocks[i].state == "free" for i in range(4))
    pool.check_invariants()


def test_allocate_takes_distinct_blocks_with_one_reference(make_pool) -> None:
    pool = make_pool(4)
    blocks = pool.allocate(3)
    assert len({b.block_id for b in blocks}) == 3
    assert all(b.ref_cnt == 1 and b.state == "in_use" for b in blocks)
    assert all(not pool.is_free(b.block_id) for b in blocks)
    assert pool.num_free == 1
    pool.check_invariants()


def test_touch_and_free_count_references(make_pool) -> None:
    pool = make_pool(4)
    (block_id,) = allocate_ids(pool, 1)
    pool.touch(block_id)
    assert pool.blocks[block_id].ref_cnt == 2
    pool.free([block_id])
    assert pool.blocks[block_id].ref_cnt == 1
    assert not pool.is_free(block_id)
    assert pool.num_free == 3
    pool.free([block_id])
    assert pool.blocks[block_id].ref_cnt == 0
    assert pool.is_free(block_id)
    assert pool.num_free == 4
    pool.check_invariants()


def test_touch_of_a_free_cached_block_takes_it_out_of_the_queue(make_pool) -> None:
    pool = make_pool(2)
    (block_id,) = allocate_ids(pool, 1)
    cache_at(pool, block_id, 0)
    pool.free([block_id])
    assert pool.num_free == 2
    pool.touch(block_id)  # a cache hit
    assert pool.blocks[block_id].ref_cnt == 1
    assert not pool.is_free(block_id)
    assert pool.num_free == 1
    assert pool.get(key(1000 + block_id)).block_id == block_id  # the hit keeps its entry
    pool.check_invariants()
    assert allocate_ids(pool, 1) != [block_id]


def test_free_of_an_unreferenced_block_raises_naming_it(make_pool) -> None:
    pool = make_pool(4)
    (block_id,) = allocate_ids(pool, 1)
    pool.free([block_id])
    with pytest.raises(InvariantError, match=f"block {block_id}"):
        pool.free([block_id])
    assert pool.blocks[block_id].ref_cnt == 0


# ------------------------------------------------------------------ free queue order


def test_free_reversed_table_evicts_the_tail_first(make_pool, sink: ListSink) -> None:
    pool = make_pool(3)
    table = allocate_ids(pool, 3)
    for index, block_id in enumerate(table):
        cache_at(pool, block_id, index)
    sink.drain()
    pool.free(reversed(table))
    pool.check_invariants()
    assert [b.block_id for b in pool.allocate(1)] == [table[-1]]
    assert removed_ids(sink) == [table[-1]]
    assert pool.get(key(1000 + table[0])) is not None  # the head of the prefix stays cached
    assert allocate_ids(pool, 2) == [table[1], table[0]]


def test_free_order_is_lru_across_requests(make_pool) -> None:
    pool = make_pool(4)
    first, second = allocate_ids(pool, 2), allocate_ids(pool, 2)
    pool.free(reversed(second))
    pool.free(reversed(first))
    assert allocate_ids(pool, 4) == [second[1], second[0], first[1], first[0]]


def test_a_block_hit_again_moves_to_the_back_of_the_queue(make_pool) -> None:
    pool = make_pool(3)
    a, b, c = allocate_ids(pool, 3)
    pool.free([a, b, c])
    pool.touch(a)
    pool.free([a])
    assert allocate_ids(pool, 3) == [b, c, a]


def test_retention_levels_order_eviction(make_pool, sink: ListSink) -> None:
    pool = make_pool(4)
    junction, resend, block, empty = allocate_ids(pool, 4)
    cache_at(pool, junction, 0, JUNCTION)
    cache_at(pool, resend, 0, RESEND, name=2)
    cache_at(pool, block, 0, BLOCK, name=3)
    sink.drain()
    # freed most-retained first, so plain LRU would evict them in the opposite order
    pool.free([junction, resend, block, empty])
    pool.check_invariants()
    order = [allocate_ids(pool, 1)[0] for _ in range(4)]
    assert order == [empty, block, resend, junction]


def test_junction_block_outlives_younger_block_entries(make_pool) -> None:
    pool = make_pool(3)
    junction, block, empty = allocate_ids(pool, 3)
    cache_at(pool, junction, 0, JUNCTION)
    cache_at(pool, block, 0, BLOCK, name=2)
    pool.free([junction])
    pool.free([block])
    pool.free([empty])
    assert allocate_ids(pool, 2) == [empty, block]
    assert pool.get(key(1000 + junction)).block_id == junction


# ------------------------------------------------------------------ pins


def test_pinned_block_never_enters_the_free_queue(make_pool) -> None:
    pool = make_pool(3)
    (pinned,) = allocate_ids(pool, 1)
    cache_at(pool, pinned, 0, PIN)
    pool.pin(pinned)
    pool.free([pinned])
    assert pool.blocks[pinned].state == "pinned"
    assert not pool.is_free(pinned)
    assert pool.num_free == 2
    assert pool.num_pinned == 1
    pool.check_invariants()
    assert pinned not in allocate_ids(pool, 2)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    assert pool.get(key(1000 + pinned)).block_id == pinned


def test_pinning_a_free_cached_block_takes_it_out_of_the_queue(make_pool) -> None:
    pool = make_pool(2)
    (block_id,) = allocate_ids(pool, 1)
    cache_at(pool, block_id, 0)
    pool.free([block_id])
    pool.pin(block_id)
    assert not pool.is_free(block_id)
    assert pool.num_free == 1
    pool.check_invariants()


def test_unpin_returns_an_ordinary_cached_block(make_pool) -> None:
    pool = make_pool(3)
    pinned, junction, other = allocate_ids(pool, 3)
    cache_at(pool, pinned, 0, PIN)
    cache_at(pool, junction, 0, JUNCTION, name=2)
    pool.pin(pinned)
    pool.free([junction, pinned, other])
    pool.pin(pinned)  # pinned twice: one unpin is not enough
    pool.unpin(pinned)
    assert not pool.is_free(pinned)
    pool.unpin(pinned)
    assert pool.is_free(pinned)
    assert pool.blocks[pinned].state == "cached"
    assert pool.get(key(1000 + pinned)).reason is BLOCK
    pool.check_invariants()
    # a `block` entry now: after the empty block, before the junction
    assert allocate_ids(pool, 3) == [other, pinned, junction]


def test_unpin_of_a_referenced_block_waits_for_its_free(make_pool) -> None:
    pool = make_pool(2)
    (block_id,) = allocate_ids(pool, 1)
    cache_at(pool, block_id, 0, PIN)
    pool.pin(block_id)
    pool.unpin(block_id)
    assert pool.blocks[block_id].state == "in_use"
    assert not pool.is_free(block_id)
    pool.check_invariants()
    pool.free([block_id])
    assert pool.is_free(block_id)
    pool.check_invariants()


def test_unpin_of_an_unpinned_block_raises(make_pool) -> None:
    pool = make_pool(2)
    with pytest.raises(InvariantError, match="block 1"):
        pool.unpin(1)


# ------------------------------------------------------------------ entries


def test_cache_registers_entries_and_emits_block_stored(make_pool, sink: ListSink) -> None:
    pool = make_pool(4)
    _, block_id = allocate_ids(pool, 2)
    added = pool.cache(block_id, [(key(1), 6, RESEND)], key(0))
    assert added == [key(1)]
    entry = pool.get(key(1))
    assert (entry.block_id, entry.position, entry.reason) == (block_id, 6, RESEND)
    assert not entry.is_full(BLOCK_SIZE)
    (event,) = sink.drain()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [key(1).hex()]
    assert event.parent_block_hash == key(0).hex()
    assert event.block_ids == [block_id]
    assert event.token_range == (4, 6)
    assert event.is_partial is True
    assert event.checkpoint_reason == "resend"
    assert (event.group, event.group_idx, event.block_size) == ("attention", 0, BLOCK_SIZE)
    pool.cache(block_id, [(key(2), 8, BLOCK)], key(1))
    (event,) = sink.drain()
    assert event.token_range == (4, 8)
    assert event.is_partial is False
    assert pool.get(key(2)).is_full(BLOCK_SIZE)
    pool.check_invariants()


def test_cache_of_existing_key_keeps_old_block_and_raises_reason(make_pool, sink) -> None:
    pool = make_pool(4)
    old, new = allocate_ids(pool, 2)
    cache_at(pool, old, 0, BLOCK, name=1)
    sink.drain()
    added = pool.cache(new, [(key(1), BLOCK_SIZE, JUNCTION)], None)
    assert added == []
    entry = pool.get(key(1))
    assert entry.block_id == old
    assert entry.reason is JUNCTION
    assert pool.blocks[new].keys == []
    assert not any(isinstance(e, BlockStored) for e in sink.drain())
    pool.check_invariants()


def test_cache_of_existing_key_never_lowers_its_reason(make_pool) -> None:
    pool = make_pool(4)
    old, new = allocate_ids(pool, 2)
    cache_at(pool, old, 0, JUNCTION, name=1)
    pool.cache(new, [(key(1), BLOCK_SIZE, BLOCK)], None)
    assert pool.get(key(1)).reason is JUNCTION


def test_raising_reason_of_a_free_block_moves_it_to_the_higher_level(make_pool) -> None:
    pool = make_pool(4)
    a, b, c, d = allocate_ids(pool, 4)
    cache_at(pool, a, 0, BLOCK, name=1)
    cache_at(pool, b, 0, BLOCK, name=2)
    pool.free([a, b])  # a would be evicted first
    pool.cache(c, [(key(1), BLOCK_SIZE, JUNCTION)], None)  # another request claims a's key
    pool.check_invariants()
    pool.free([c, d])
    assert allocate_ids(pool, 4) == [c, d, b, a]


def test_eviction_on_allocate_removes_keys_and_emits_block_removed(make_pool, sink) -> None:
    pool = make_pool(1)
    (block_id,) = allocate_ids(pool, 1)
    pool.cache(block_id, [(key(1), 2, RESEND), (key(2), 4, BLOCK)], None)
    pool.free([block_id])
    sink.drain()
    assert allocate_ids(pool, 1) == [block_id]
    assert pool.get(key(1)) is None and pool.get(key(2)) is None
    assert pool.blocks[block_id].keys == []
    (event,) = sink.drain()
    assert isinstance(event, BlockRemoved)
    assert sorted(event.block_hashes) == sorted([key(1).hex(), key(2).hex()])
    assert event.block_ids == [block_id]
    assert (event.group, event.group_idx) == ("attention", 0)
    pool.check_invariants()


def test_eviction_of_a_block_without_entries_emits_nothing(make_pool, sink) -> None:
    pool = make_pool(1)
    pool.free(allocate_ids(pool, 1))
    sink.drain()
    pool.allocate(1)
    assert not any(isinstance(e, BlockRemoved) for e in sink.drain())


def test_move_hashes_repoints_every_key(make_pool, sink: ListSink) -> None:
    pool = BlockPool(4, 8, "mamba", 1, sink)
    live, owned = allocate_ids(pool, 2)
    pool.cache(live, [(key(1), 4, RESEND), (key(2), 8, BLOCK)], None)
    sink.drain()
    pool.move_hashes(live, owned)
    assert pool.get(key(1)).block_id == owned
    assert pool.get(key(2)).block_id == owned
    assert pool.blocks[live].keys == []
    assert sorted(pool.blocks[owned].keys) == [key(1), key(2)]
    events = sink.drain()
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, BlockHashesMoved)
    assert (event.src_block_id, event.dst_block_id) == (live, owned)
    assert sorted(event.block_hashes) == [key(1).hex(), key(2).hex()]
    assert (event.group, event.group_idx) == ("mamba", 1)
    pool.check_invariants()
    # the live block is reused without losing the moved entries
    pool.free([live])
    assert allocate_ids(pool, 3)[-1] == live
    assert pool.get(key(1)).block_id == owned
    assert not any(isinstance(e, (BlockRemoved, BlockStored)) for e in sink.drain())


def test_move_hashes_of_a_pinned_block_raises(make_pool) -> None:
    pool = make_pool(2)
    src, dst = allocate_ids(pool, 2)
    cache_at(pool, src, 0, PIN)
    pool.pin(src)
    with pytest.raises(InvariantError, match=f"block {src}"):
        pool.move_hashes(src, dst)


def test_no_free_blocks_when_over_asking(make_pool, sink: ListSink) -> None:
    pool = make_pool(4)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(5)
    table = allocate_ids(pool, 3)
    cache_at(pool, table[0], 0)
    pool.free([table[0]])
    sink.drain()
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(3)
    # a refused allocation changes nothing
    assert pool.num_free == 2
    assert pool.get(key(1000 + table[0])) is not None
    assert sink.drain() == []
    pool.check_invariants()
    assert len(pool.allocate(2)) == 2


# ------------------------------------------------------------------ invariants


@pytest.fixture
def busy_pool(make_pool) -> BlockPool:
    """Blocks in every state: 0 in use, 1 free and cached, 2 pinned, 3 free and empty."""
    pool = make_pool(4)
    table = allocate_ids(pool, 3)
    assert table == [0, 1, 2]
    for index, block_id in enumerate(table):
        cache_at(pool, block_id, index, PIN if block_id == 2 else BLOCK)
    pool.pin(2)
    pool.free([2, 1])
    pool.check_invariants()
    return pool


def test_check_invariants_passes_after_a_mix_of_actions(busy_pool: BlockPool) -> None:
    busy_pool.touch(1)
    busy_pool.check_invariants()
    busy_pool.free([1, 0])
    busy_pool.unpin(2)
    busy_pool.check_invariants()
    busy_pool.allocate(4)
    busy_pool.check_invariants()


def test_check_invariants_catches_negative_ref_cnt(busy_pool: BlockPool) -> None:
    busy_pool.blocks[3].ref_cnt = -1
    with pytest.raises(InvariantError, match=r"block 3\b"):
        busy_pool.check_invariants()


def test_check_invariants_catches_referenced_block_in_free_queue(busy_pool: BlockPool) -> None:
    busy_pool.blocks[1].ref_cnt = 1  # block 1 sits in the free queue
    with pytest.raises(InvariantError, match=r"block 1\b"):
        busy_pool.check_invariants()


def test_check_invariants_catches_in_use_block_missing_from_queue(busy_pool) -> None:
    busy_pool.blocks[0].ref_cnt = 0  # freed behind the pool's back
    with pytest.raises(InvariantError, match=r"block 0\b"):
        busy_pool.check_invariants()


def test_check_invariants_catches_entry_on_the_wrong_block(busy_pool: BlockPool) -> None:
    busy_pool.entries[key(1001)].block_id = 0
    with pytest.raises(InvariantError, match=r"block [01]\b"):
        busy_pool.check_invariants()


def test_check_invariants_catches_entry_outside_its_block(busy_pool: BlockPool) -> None:
    busy_pool.entries[key(1000)].position = 3 * BLOCK_SIZE
    with pytest.raises(InvariantError, match=r"block 0\b"):
        busy_pool.check_invariants()


def test_check_invariants_catches_negative_pin_cnt(busy_pool: BlockPool) -> None:
    busy_pool.blocks[0].pin_cnt = -1
    with pytest.raises(InvariantError, match=r"block 0\b"):
        busy_pool.check_invariants()


def test_check_invariants_catches_a_stale_stored_retention(busy_pool: BlockPool) -> None:
    busy_pool.entries[key(1000)].reason = CheckpointReason.JUNCTION  # behind the pool's back
    with pytest.raises(InvariantError, match=r"block 0: stored retention 2 .* 4"):
        busy_pool.check_invariants()


def test_stored_retention_follows_cache_move_evict_and_unpin(busy_pool: BlockPool) -> None:
    """Block.retention is the highest retention of the block's entries after every action."""
    pool = busy_pool
    assert [b.retention for b in pool.blocks] == [2, 2, 5, 0]
    pool.cache(1, [(key(1001), BLOCK_SIZE * 2, CheckpointReason.JUNCTION)], None)  # raised
    assert pool.blocks[1].retention == 4
    pool.unpin(2)  # pin entries become block ones
    assert pool.blocks[2].retention == 2
    (dst,) = allocate_ids(pool, 1)  # block 3, the empty one
    pool.touch(1)
    pool.move_hashes(1, dst)
    assert (pool.blocks[1].retention, pool.blocks[dst].retention) == (0, 4)
    pool.free([1, dst, 0])
    pool.check_invariants()
    pool.allocate(4)  # evicts every entry
    assert [b.retention for b in pool.blocks] == [0, 0, 0, 0]
    pool.check_invariants()
