"""The attention blocks the cached Mamba states need (`engine.cache.support`): counted per key of
a state's prefix, given up last by `reuse`, and checked against the Mamba pool's entries."""

from __future__ import annotations

import pytest

from engine.cache.block import InvariantError
from engine.cache.block_pool import BlockPool
from engine.cache.entry import CheckpointReason, Entry
from engine.cache.support import StateSupport

UNIT = 4


def key_of(index: int) -> bytes:
    return index.to_bytes(8, "little") + b"s" * 8


def cached_chain(pool: BlockPool, first: int, num: int) -> list[bytes]:
    """Cache a chain of `num` full attention blocks (one key each) and free them."""
    blocks = pool.allocate(num)
    keys = [key_of(first + i) for i in range(num)]
    for index, (block, key) in enumerate(zip(blocks, keys, strict=True)):
        parent = keys[index - 1] if index else None
        pool.cache(block.block_id, [(key, (index + 1) * pool.block_size, CheckpointReason.BLOCK)],
                   parent)  # fmt: skip
    pool.free([block.block_id for block in blocks])
    return keys


def test_a_state_marks_its_key_and_every_attention_block_end_before_it_is_needed() -> None:
    """Each needed key counts the states at it plus its needed children (the next block end,
    or a state inside the next block), so a state below a needed key walks no further."""
    pool = BlockPool(8, 8, "attention", 0, eviction="reuse")  # Ba 8, U 4: two hashes a block
    support = StateSupport(pool, UNIT)
    hashes = [key_of(i) for i in range(6)]  # 24 tokens
    support.cached(hashes, 20)  # inside the third block: its key and the ends at 16 and 8
    assert support.counts == {hashes[4]: 1, hashes[3]: 1, hashes[1]: 1}
    support.cached(hashes, 16)  # on the second block's end: needed already
    support.cached(hashes, 16)  # a key held already counts once
    assert support.counts == {hashes[4]: 1, hashes[3]: 2, hashes[1]: 1}
    other = [*hashes[:2], key_of(50), key_of(51)]  # parts after the first block
    support.cached(other, 16)
    assert support.counts == {hashes[4]: 1, hashes[3]: 2, hashes[1]: 2, key_of(51): 1}
    support.evicted([hashes[4], key_of(99)])  # a key it never counted changes nothing
    assert support.counts == {hashes[3]: 1, hashes[1]: 2, key_of(51): 1}
    support.evicted([hashes[3], key_of(51)])
    assert support.counts == {}


def test_reuse_gives_up_the_blocks_no_cached_state_needs_first_however_recent() -> None:
    """Chain `a` was freed before chain `b`, so recency alone gives `a` up first; once a state
    past `a`'s blocks is cached, `b` goes first; once that state is given up, `a`'s blocks are
    ordered by recency again, as just freed from the chain's end back, so its end goes
    first."""
    pool = BlockPool(8, UNIT, "attention", 0, eviction="reuse")
    support = StateSupport(pool, UNIT)
    pool.eviction.couple_support(support.counts)
    a = cached_chain(pool, 0, 4)
    b = cached_chain(pool, 10, 4)
    order = [block.block_id for block in pool.eviction._in_order()]
    holder = {key: pool.entries[key].block_id for key in a + b}
    assert order == [holder[key] for key in a + b]
    support.cached(a, 16)  # the state after `a`'s 16 tokens
    pool.check_invariants()
    assert [block.block_id for block in pool.eviction._in_order()][:4] == [holder[k] for k in b]
    taken = [block.block_id for block in pool.allocate(2)]
    assert taken == [holder[key] for key in b[:2]]
    support.evicted([a[-1]])  # `a`'s blocks move back as just freed, from its end
    pool.check_invariants()
    order = [block.block_id for block in pool.eviction._in_order()]
    assert order == [holder[key] for key in b[2:] + a[::-1]]


def test_the_counts_must_match_the_cached_states() -> None:
    pool = BlockPool(4, UNIT, "attention", 0, eviction="reuse")
    support = StateSupport(pool, UNIT)
    hashes = [key_of(i) for i in range(3)]
    support.cached(hashes, 12)
    state = Entry(hashes[2], 0, 12, CheckpointReason.BLOCK)
    support.check_invariants({hashes[2]: state})
    with pytest.raises(InvariantError, match="marked but not cached"):
        support.check_invariants({})
    support.counts[hashes[0]] += 1
    with pytest.raises(InvariantError, match="counts disagree"):
        support.check_invariants({hashes[2]: state})
