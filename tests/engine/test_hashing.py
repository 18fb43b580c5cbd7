"""Chained prefix hashes `H_p = hash(H_{p-U}, tokens[p-U:p], extra_keys)` (docs/rules.md section
4)."""

from __future__ import annotations

import random

import pytest

from engine.hashing import extend_hashes, hash_prefix, root_hash

UNIT = 4


@pytest.fixture
def make_tokens():
    def make(num: int, seed: int = 0) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(0, 50_000) for _ in range(num)]

    return make


def test_same_tokens_give_same_hashes(make_tokens) -> None:
    tokens = make_tokens(40)
    assert hash_prefix(tokens, UNIT) == hash_prefix(list(tokens), UNIT)
    assert hash_prefix(tuple(tokens), UNIT) == hash_prefix(tokens, UNIT)


def test_one_hash_per_complete_unit_all_distinct(make_tokens) -> None:
    hashes = hash_prefix(make_tokens(40), UNIT)
    assert len(hashes) == 10
    assert len(set(hashes)) == 10
    assert all(isinstance(h, bytes) for h in hashes)


def test_incomplete_trailing_unit_gets_no_hash(make_tokens) -> None:
    tokens = make_tokens(43)
    hashes = hash_prefix(tokens, UNIT)
    assert len(hashes) == 10
    assert hashes == hash_prefix(tokens[:40], UNIT)
    assert hash_prefix(tokens[:3], UNIT) == []
    assert hash_prefix([], UNIT) == []


def test_changing_token_zero_changes_every_hash(make_tokens) -> None:
    tokens = make_tokens(40)
    changed = [tokens[0] + 1, *tokens[1:]]
    for before, after in zip(hash_prefix(tokens, UNIT), hash_prefix(changed, UNIT), strict=True):
        assert before != after


@pytest.mark.parametrize("index", [0, 3, 4, 17, 39])
def test_hash_at_p_depends_on_every_token_before_p(make_tokens, index: int) -> None:
    tokens = make_tokens(40)
    changed = list(tokens)
    changed[index] += 1
    original, altered = hash_prefix(tokens, UNIT), hash_prefix(changed, UNIT)
    first_affected = index // UNIT  # hashes[k] is H_{(k+1) * U}
    assert original[:first_affected] == altered[:first_affected]
    for k in range(first_affected, len(original)):
        assert original[k] != altered[k], f"H_{(k + 1) * UNIT} ignores token {index}"


def test_hash_depends_on_order_within_a_unit(make_tokens) -> None:
    tokens = make_tokens(8)
    swapped = [tokens[1], tokens[0], *tokens[2:]]
    assert tokens[0] != tokens[1]
    assert hash_prefix(tokens, UNIT)[0] != hash_prefix(swapped, UNIT)[0]


def test_shared_prefix_equal_up_to_divergence_unit_and_different_after(make_tokens) -> None:
    shared = make_tokens(22, seed=1)  # diverges inside the sixth unit, at position 22
    a = shared + make_tokens(18, seed=2)
    b = shared + make_tokens(18, seed=3)
    assert a[22] != b[22]
    hashes_a, hashes_b = hash_prefix(a, UNIT), hash_prefix(b, UNIT)
    assert hashes_a[:5] == hashes_b[:5]  # H_4 .. H_20 cover only shared tokens
    assert all(x != y for x, y in zip(hashes_a[5:], hashes_b[5:], strict=True))


def test_prefix_hashes_are_a_prefix_of_longer_prompt_hashes(make_tokens) -> None:
    tokens = make_tokens(64)
    assert hash_prefix(tokens, UNIT)[:7] == hash_prefix(tokens[:28], UNIT)


def test_cache_salt_changes_every_hash(make_tokens) -> None:
    tokens = make_tokens(40)
    plain = hash_prefix(tokens, UNIT)
    salted = hash_prefix(tokens, UNIT, cache_salt="tenant-a")
    other = hash_prefix(tokens, UNIT, cache_salt="tenant-b")
    assert len(salted) == len(plain) == len(other)
    for k in range(len(plain)):
        assert len({plain[k], salted[k], other[k]}) == 3
    assert salted == hash_prefix(tokens, UNIT, cache_salt="tenant-a")


def test_root_hash_depends_on_salt() -> None:
    assert root_hash(None) != root_hash("x")
    assert root_hash("x") != root_hash("y")
    assert root_hash("x") == root_hash("x")


def test_unit_size_matters(make_tokens) -> None:
    tokens = make_tokens(16)
    by_two, by_four = hash_prefix(tokens, 2), hash_prefix(tokens, 4)
    assert len(by_two) == 8 and len(by_four) == 4
    # H_4 chained in two steps differs from H_4 in one step; both are valid names for [0, 4)
    # only within one unit size, so they must not collide.
    assert by_two[1] != by_four[0]


@pytest.mark.parametrize("steps", [[40], [4, 8, 12, 40], [1, 3, 5, 6, 7, 22, 23, 40], [0, 39, 40]])
def test_extend_hashes_incrementally_equals_hash_prefix(make_tokens, steps: list[int]) -> None:
    tokens = make_tokens(40)
    hashes: list[bytes] = []
    for stop in steps:
        extend_hashes(hashes, tokens[:stop], UNIT)
        assert hashes == hash_prefix(tokens[:stop], UNIT)
    assert hashes == hash_prefix(tokens, UNIT)


def test_extend_hashes_incrementally_with_salt(make_tokens) -> None:
    tokens = make_tokens(40)
    hashes: list[bytes] = []
    for stop in (5, 13, 40):
        extend_hashes(hashes, tokens[:stop], UNIT, cache_salt="s")
    assert hashes == hash_prefix(tokens, UNIT, cache_salt="s")
    assert hashes != hash_prefix(tokens, UNIT)


def test_extend_hashes_is_idempotent_when_nothing_new(make_tokens) -> None:
    tokens = make_tokens(42)
    hashes = hash_prefix(tokens, UNIT)
    before = list(hashes)
    extend_hashes(hashes, tokens, UNIT)
    extend_hashes(hashes, tokens[:20], UNIT)  # shorter than covered: nothing to add
    assert hashes == before
