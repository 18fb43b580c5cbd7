"""L2 in host memory: bounded at every moment, refuses what cannot fit, and gives up least
recently used leaves, so a unit's ancestors are kept at least as long as the unit."""

from __future__ import annotations

from engine.tiers import HostTier
from tests.engine.tiers.conftest import UNIT_BYTES, make_chain


def roots(num: int):
    return [make_chain(seed, 1)[0] for seed in range(100, 100 + num)]


def test_the_tier_stays_within_its_bytes() -> None:
    tier = HostTier(3 * UNIT_BYTES)
    for unit in roots(6):
        assert tier.put(unit).is_stored
        assert tier.num_bytes <= tier.capacity_bytes
        tier.check_invariants()
    assert len(tier.keys()) == 3
    assert tier.stats().num_evictions == 3


def test_a_unit_larger_than_the_tier_is_refused() -> None:
    tier = HostTier(2 * UNIT_BYTES)
    small = roots(1)[0]
    tier.put(small)
    big = make_chain(7, 1, num_blocks=4)[0]
    result = tier.put(big)
    assert not result.is_stored and result.evicted == []
    assert not tier.contains(big.key) and tier.contains(small.key)
    assert tier.stats().num_refused == 1


def test_a_read_refreshes_a_unit() -> None:
    tier = HostTier(3 * UNIT_BYTES)
    a, b, c, d = roots(4)
    for unit in (a, b, c):
        tier.put(unit)
    assert tier.get(a.key) is a
    evicted = tier.put(d).evicted
    assert [u.key for u in evicted] == [b.key]
    assert tier.stats().num_hits == 1 and tier.stats().bytes_out == UNIT_BYTES


def test_leaves_go_before_their_ancestors() -> None:
    """The chain's root is the least recently used unit, yet its leaf goes first, then the
    unit above it: no unit is ever held without its parent."""
    tier = HostTier(4 * UNIT_BYTES)
    chain, others = make_chain(1, 3), roots(4)
    for unit in [*chain, others[0]]:
        tier.put(unit)
    given_up = []
    for unit in others[1:]:
        given_up += [u.key for u in tier.put(unit).evicted]
        for key in tier.keys():
            parent = tier.index.records[key].parent
            assert parent is None or tier.contains(parent), "a unit outlived its parent"
    assert given_up == [chain[2].key, chain[1].key, chain[0].key]


def test_a_new_units_parent_is_not_given_up_for_it() -> None:
    tier = HostTier(2 * UNIT_BYTES)
    root, child = make_chain(1, 2)
    other = roots(1)[0]
    tier.put(root)
    tier.put(other)
    tier.get(other.key)  # the root is now the least recently used leaf
    assert [u.key for u in tier.put(child).evicted] == [other.key]
    assert tier.contains(root.key) and tier.contains(child.key)


def test_a_tier_of_parents_refuses_rather_than_orphan() -> None:
    """A unit whose parent fills the tier, and whose own room would need the parent gone."""
    tier = HostTier(UNIT_BYTES)
    root, child = make_chain(1, 2)
    tier.put(root)
    result = tier.put(child)
    assert not result.is_stored and tier.contains(root.key)


def test_remove_and_put_again() -> None:
    tier = HostTier(2 * UNIT_BYTES)
    unit = roots(1)[0]
    tier.put(unit)
    assert tier.remove(unit.key) is unit
    assert tier.remove(unit.key) is None and tier.num_bytes == 0
    assert tier.put(unit).is_stored and tier.put(unit).is_stored  # a second put refreshes
    assert tier.num_bytes == UNIT_BYTES
    tier.check_invariants()
