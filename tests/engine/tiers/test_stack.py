"""L2 over L3: what host memory gives up goes to disk, a disk hit is promoted, a lookup is the
longest prefix some tier holds, and no unit outlives the unit it chains from."""

from __future__ import annotations

from pathlib import Path

from engine.tiers import DiskTier, HostTier, TierHit, TierStack
from engine.tiers.codec import encode
from tests.engine.tiers.conftest import UNIT_BYTES, make_chain


def stack_of(tmp_path: Path, fingerprint: dict, host_units: int, disk_units: int | None):
    disk = None
    if disk_units is not None:
        room = disk_units * (len(encode(make_chain(0, 1)[0])) + 16)
        disk = DiskTier(tmp_path, room, fingerprint)
    return TierStack(HostTier(host_units * UNIT_BYTES), disk)


def test_what_host_memory_gives_up_goes_to_disk(tmp_path: Path, fingerprint: dict) -> None:
    stack = stack_of(tmp_path, fingerprint, 2, 8)
    chain = make_chain(1, 4)
    assert [stack.put(unit) for unit in chain] == ["host"] * 4
    assert stack.lookup([u.key for u in chain]) == TierHit(4, ["disk", "disk", "host", "host"])
    stats = stack.stats()
    assert stats.num_demoted == 2 and stats.disk.num_units == 2 and stats.host.num_units == 2
    assert stats.disk.bytes_in > 0 and stats.host.bytes_in == 4 * UNIT_BYTES
    stack.check_invariants()


def test_without_a_disk_what_host_memory_gives_up_is_gone(
    tmp_path: Path, fingerprint: dict
) -> None:
    stack = stack_of(tmp_path, fingerprint, 2, None)
    roots = [make_chain(seed, 1)[0] for seed in range(3)]
    for unit in roots:
        stack.put(unit)
    assert stack.lookup([roots[0].key]).num_units == 0
    assert stack.stats().num_dropped == 1 and stack.stats().disk is None
    stack.check_invariants()


def test_a_lookup_stops_at_the_first_unit_no_tier_holds(tmp_path: Path, fingerprint: dict) -> None:
    stack = stack_of(tmp_path, fingerprint, 4, 4)
    chain = make_chain(1, 4)
    for unit in chain[:2]:
        stack.put(unit)
    stack.demote(chain[1].key)
    keys = [u.key for u in chain]
    assert stack.lookup(keys) == TierHit(2, ["host", "disk"])
    assert stack.lookup(keys[2:]) == TierHit(0, [])
    assert stack.stats().host.num_hits == 0  # a lookup reads nothing


def test_a_disk_hit_is_promoted_and_stays_on_disk(tmp_path: Path, fingerprint: dict) -> None:
    stack = stack_of(tmp_path, fingerprint, 4, 4)
    unit = make_chain(1, 1)[0]
    stack.put(unit)
    assert stack.demote(unit.key)
    back = stack.load(unit.key)
    assert back is not None and back.same_payloads(unit)
    assert unit.key in stack.host and unit.key in stack.disk
    stats = stack.stats()
    assert stats.num_promoted == 1 and stats.disk.num_hits == 1 and stats.disk.bytes_out > 0
    again = stack.load(unit.key)
    assert again is not None and stack.stats().host.num_hits == 1
    stack.check_invariants()


def test_a_corrupt_unit_on_disk_takes_the_units_below_it(tmp_path: Path, fingerprint: dict) -> None:
    stack = stack_of(tmp_path, fingerprint, 4, 8)
    chain = make_chain(1, 3)
    for unit in chain:
        stack.put(unit)
    for unit in chain:
        stack.demote(unit.key)
    path = stack.disk.path(chain[1].key)
    path.write_bytes(path.read_bytes()[:-1])
    assert stack.load(chain[0].key) is not None
    assert stack.load(chain[1].key) is None
    assert stack.lookup([u.key for u in chain]) == TierHit(1, ["host"])
    stats = stack.stats()
    assert stats.disk.num_corrupt == 1 and stats.num_cascaded == 1
    stack.check_invariants()


def test_disk_keeps_a_parent_while_host_memory_holds_its_child(
    tmp_path: Path, fingerprint: dict
) -> None:
    """The root is the disk's least recently used unit, but a unit in host memory chains
    from it: the disk gives up another unit instead."""
    stack = stack_of(tmp_path, fingerprint, 4, 2)
    root, child = make_chain(1, 2)
    others = [make_chain(seed, 1)[0] for seed in range(10, 13)]
    stack.put(root)
    stack.demote(root.key)
    stack.put(child)
    for unit in others:
        stack.put(unit)
        stack.demote(unit.key)
    assert stack.lookup([root.key, child.key]) == TierHit(2, ["disk", "host"])
    assert stack.disk.index.holds[root.key] == 1
    stack.check_invariants()


def test_a_unit_whose_parent_is_on_the_device_is_detached_until_it_arrives(
    tmp_path: Path, fingerprint: dict
) -> None:
    stack = stack_of(tmp_path, fingerprint, 4, 4)
    root, child = make_chain(1, 2)
    stack.put(child)
    assert stack.detached == {child.key}
    stack.check_invariants()
    stack.put(root)
    assert stack.detached == set()
    stack.check_invariants()


def test_remove_takes_the_units_below(tmp_path: Path, fingerprint: dict) -> None:
    stack = stack_of(tmp_path, fingerprint, 4, 4)
    chain = make_chain(1, 3)
    for unit in chain:
        stack.put(unit)
    stack.demote(chain[2].key)
    assert stack.remove(chain[1].key)
    assert stack.lookup([u.key for u in chain]) == TierHit(1, ["host"])
    assert list(stack.disk.directory.glob("*.unit")) == []
    stack.check_invariants()


def test_a_restart_finds_the_disk_units(tmp_path: Path, fingerprint: dict) -> None:
    stack = stack_of(tmp_path, fingerprint, 1, 8)
    chain = make_chain(1, 4)
    for unit in chain:
        stack.put(unit)
    restarted = TierStack(HostTier(UNIT_BYTES), DiskTier(tmp_path, 1 << 20, fingerprint))
    hit = restarted.lookup([u.key for u in chain])
    assert hit == TierHit(3, ["disk"] * 3)  # the last unit was in host memory only
    for unit in chain[:3]:
        back = restarted.load(unit.key)
        assert back is not None and back.same_payloads(unit)
        restarted.check_invariants()
