"""Lookup rules of docs/rules.md section 3, with its worked numbers."""

from __future__ import annotations

from engine.config import CacheConfig
from tests.engine.conftest import CacheBuilder, tokens


def config(**overrides) -> CacheConfig:
    base = {"block_size": 4, "mamba_block_size": 8, "prefix_match_unit": 2, "num_blocks": 64}
    return CacheConfig(**{**base, **overrides})


def test_worked_two_full_blocks_hit_8_without_eagle_and_6_with():
    prompt = tokens(1, 9)
    for eagle, expected in ((False, 8), (True, 6)):
        cache = CacheBuilder(config(eagle=eagle))
        cache.attention(prompt, [4, 8])
        assert cache.lookup(prompt).attention_length == expected


def test_worked_full_block_and_partial_entry_hit_6_without_eagle_and_4_with():
    prompt = tokens(1, 9)
    for eagle, expected in ((False, 6), (True, 4)):
        cache = CacheBuilder(config(eagle=eagle))
        cache.attention(prompt, [4])
        cache.attention(prompt, [6])
        assert cache.lookup(prompt).attention_length == expected


def test_eagle_reads_the_proof_one_unit_past_the_limit():
    """An exact resend of 8 cached tokens: the limit is 7, but EAGLE may read the entry at 8
    and drop one unit to 6; reading only up to the limit would give 4."""
    prompt = tokens(2, 8)
    cache = CacheBuilder(config(eagle=True))
    cache.attention(prompt, [4, 8])
    assert cache.lookup(prompt).attention_length == 6


def test_eagle_drops_one_block_when_hits_are_coarse():
    prompt = tokens(3, 17)
    cache = CacheBuilder(config(eagle=True, partial_hits=False))
    cache.attention(prompt, [4, 8, 12, 16])
    assert cache.lookup(prompt).attention_length == 12


def test_interior_unit_of_a_block_whose_chain_diverges_later_is_a_hit():
    cached = tokens(4, 8)
    cache = CacheBuilder(config())
    cache.attention(cached, [4, 6, 8])
    reader = cached[:6] + [cached[6] ^ 1, 7, 7]
    hit = cache.lookup(reader)
    assert hit.attention_length == 6
    assert len(hit.attention_block_ids) == 2


def test_hit_never_reaches_the_last_prompt_token():
    prompt = tokens(5, 8)
    cache = CacheBuilder(config())
    cache.attention(prompt, [4, 6, 8])
    cache.checkpoint(prompt, 8)
    cache.checkpoint(prompt, 6)
    hit = cache.lookup(prompt)
    assert hit.attention_length == 6  # limit 7, on the 2-token grid
    assert hit.length == 6


def test_coordinator_takes_the_mamba_checkpoint_below_the_attention_match():
    prompt = tokens(6, 12)
    cache = CacheBuilder(config())
    cache.attention(prompt, [4, 6])
    cache.checkpoint(prompt, 4)
    hit = cache.lookup(prompt)
    assert (hit.attention_length, hit.length) == (6, 4)
    assert hit.by_group == {"attention": 6, "mamba": 4}


def test_mamba_lookup_is_not_downward_closed():
    """Checkpoints at 2 and 8 with an attention match of 6: the hit is 2, not 6."""
    prompt = tokens(7, 12)
    cache = CacheBuilder(config())
    cache.attention(prompt, [4, 6])
    cache.checkpoint(prompt, 2)
    cache.checkpoint(prompt, 8)
    assert cache.lookup(prompt).length == 2


def test_partial_hits_off_land_on_the_scheduler_block():
    prompt = tokens(8, 20)
    cache = CacheBuilder(config(partial_hits=False))
    cache.attention(prompt, [4, 8, 12, 16])
    cache.checkpoint(prompt, 12)
    cache.checkpoint(prompt, 8)
    assert cache.lookup(prompt).length == 8  # lcm(4, 8): 12 is not on the grid


def test_dcp_scales_the_attention_block():
    prompt = tokens(9, 20)
    cache = CacheBuilder(config(dcp_size=2))
    assert cache.coordinator.attention.block_size == 8
    cache.attention(prompt, [8, 12])
    cache.checkpoint(prompt, 12)
    hit = cache.lookup(prompt)
    assert hit.length == 12
    assert len(hit.attention_block_ids) == 2


def test_salted_requests_never_share():
    prompt = tokens(10, 9)
    cache = CacheBuilder(config())
    cache.attention(prompt, [4, 8])
    from engine.hashing import hash_prefix

    salted = hash_prefix(prompt, 2, cache_salt="tenant-b")
    assert cache.coordinator.lookup(salted, len(prompt), True).attention_length == 0


def test_prefix_caching_off_never_hits():
    prompt = tokens(11, 9)
    cache = CacheBuilder(config(enable_prefix_caching=False))
    cache.attention(prompt, [4, 8])
    assert cache.lookup(prompt).length == 0
