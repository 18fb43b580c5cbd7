"""L3 on disk: one checked file per unit, written whole or not at all, bounded in bytes, found
again after a restart, and refused to another model or geometry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.cache.block import InvariantError
from engine.hashing import hash_prefix
from engine.tiers import DiskTier, TierUnit
from engine.tiers.codec import encode
from engine.tiers.fingerprint import FINGERPRINT_FILE
from tests.engine.tiers.conftest import make_chain

FILE_BYTES = len(encode(make_chain(0, 1)[0]))  # one test unit's file


def test_a_unit_reads_back_equal(tmp_path: Path, fingerprint: dict) -> None:
    keys = hash_prefix(list(range(8)), 4)
    blocks = (
        {"k.0": torch.randn(2, 3).to(torch.bfloat16), "v.0": torch.randn(2, 3)[:, 1]},
        {"token_ids": torch.arange(4)},
    )
    state = {"conv.0": torch.randn(3, 2).t(), "ssm.0": torch.tensor([], dtype=torch.float16)}
    unit = TierUnit(keys[1], keys[0], 4, 8, blocks, state)
    tier = DiskTier(tmp_path, 1 << 20, fingerprint)
    assert tier.put(unit).is_stored
    back = tier.get(unit.key)
    assert back is not None and back.same_payloads(unit)
    assert (back.key, back.parent, back.start, back.end) == (unit.key, unit.parent, 4, 8)
    assert back.size_bytes == unit.size_bytes
    tier.check_invariants()


def test_the_directory_stays_within_its_bytes(tmp_path: Path, fingerprint: dict) -> None:
    tier = DiskTier(tmp_path, 3 * FILE_BYTES, fingerprint)
    for seed in range(6):
        assert tier.put(make_chain(seed, 1)[0]).is_stored
        on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.unit"))
        assert on_disk == tier.num_bytes <= 3 * FILE_BYTES
        tier.check_invariants()
    assert tier.stats().num_evictions == 3


def test_a_unit_larger_than_the_directory_is_refused(tmp_path: Path, fingerprint: dict) -> None:
    tier = DiskTier(tmp_path, 2 * FILE_BYTES, fingerprint)
    big = make_chain(1, 1, num_blocks=20)[0]
    assert not tier.put(big).is_stored
    assert list(tmp_path.glob("*.unit")) == [] and tier.stats().num_refused == 1


def write_one(directory: Path, fingerprint: dict) -> tuple[DiskTier, TierUnit, Path]:
    tier = DiskTier(directory, 1 << 20, fingerprint)
    unit = make_chain(3, 1)[0]
    tier.put(unit)
    return tier, unit, tier.path(unit.key)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: os.truncate(path, path.stat().st_size - 5),
        lambda path: os.truncate(path, 20),
        lambda path: flip(path, path.stat().st_size - 3),  # a tensor byte
        lambda path: flip(path, 60),  # a header byte
        lambda path: flip(path, 10),  # the checksum itself
    ],
    ids=["truncated", "truncated-to-head", "tensor-byte", "header-byte", "checksum-byte"],
)
def test_a_damaged_file_is_dropped_and_counted(tmp_path: Path, fingerprint: dict, damage) -> None:
    tier, unit, path = write_one(tmp_path, fingerprint)
    damage(path)
    assert tier.get(unit.key) is None
    assert not path.exists() and not tier.contains(unit.key)
    assert tier.stats().num_corrupt == 1
    tier.check_invariants()


def test_a_restart_finds_every_intact_unit(tmp_path: Path, fingerprint: dict) -> None:
    tier = DiskTier(tmp_path, 1 << 20, fingerprint)
    chain = make_chain(5, 4)
    for unit in chain:
        tier.put(unit)
    os.truncate(tier.path(chain[3].key), 100)  # a file a crash or a disk cut short
    reopened = DiskTier(tmp_path, 1 << 20, fingerprint)
    assert sorted(reopened.keys()) == sorted(u.key for u in chain[:3])
    assert reopened.stats().num_corrupt == 1
    for unit in chain[:3]:
        back = reopened.get(unit.key)
        assert back is not None and back.same_payloads(unit) and back.parent == unit.parent
    reopened.check_invariants()


def test_a_restart_on_less_room_gives_up_leaves(tmp_path: Path, fingerprint: dict) -> None:
    tier = DiskTier(tmp_path, 1 << 20, fingerprint)
    chain = make_chain(5, 4)
    for unit in chain:
        tier.put(unit)
    room = sum(len(encode(unit)) for unit in chain[:2])
    reopened = DiskTier(tmp_path, room, fingerprint)
    assert sorted(reopened.keys()) == sorted(u.key for u in chain[:2])
    reopened.check_invariants()


def test_another_geometry_is_refused_by_name(tmp_path: Path, fingerprint: dict) -> None:
    DiskTier(tmp_path, 1 << 20, fingerprint)
    other = {**fingerprint, "dtype": "bfloat16"}
    with pytest.raises(ValueError) as refused:
        DiskTier(tmp_path, 1 << 20, other)
    message = str(refused.value)
    assert message.startswith(f"--disk-cache-dir {tmp_path}: written for another model")
    assert "dtype: 'float32' -> 'bfloat16'" in message
    assert "pass the directory that model's engine used, or an empty or new one" in message


def test_a_fresh_directory_takes_the_fingerprint(tmp_path: Path, fingerprint: dict) -> None:
    directory = tmp_path / "new" / "cache"
    DiskTier(directory, 1 << 20, fingerprint)
    assert (directory / FINGERPRINT_FILE).exists()
    DiskTier(directory, 1 << 20, fingerprint)  # the same geometry opens it again


def test_units_without_a_fingerprint_are_refused(tmp_path: Path, fingerprint: dict) -> None:
    _, _, _ = write_one(tmp_path, fingerprint)
    (tmp_path / FINGERPRINT_FILE).unlink()
    with pytest.raises(ValueError, match="--disk-cache-dir .* holds cache units but no"):
        DiskTier(tmp_path, 1 << 20, fingerprint)


def test_a_failed_write_leaves_no_file(tmp_path: Path, fingerprint: dict, monkeypatch) -> None:
    """A writer that dies before its rename leaves neither a final file nor its temp file."""
    tier = DiskTier(tmp_path, 1 << 20, fingerprint)
    unit = make_chain(3, 1)[0]

    def crash(src, dst):
        raise OSError("the disk went away")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="went away"):
        tier.put(unit)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [FINGERPRINT_FILE]
    assert not tier.contains(unit.key)
    tier.check_invariants()


def test_a_crashed_writers_temp_file_is_never_a_unit(tmp_path: Path, fingerprint: dict) -> None:
    """A process killed mid-write leaves a partial temp file: never indexed, and deleted on
    reopening once it is too old to belong to a live writer."""
    tier, unit, path = write_one(tmp_path, fingerprint)
    partial = tmp_path / f".{path.name}.999.dead.tmp"
    partial.write_bytes(path.read_bytes()[:50])
    young = tmp_path / f".{path.name}.998.live.tmp"
    young.write_bytes(b"being written")
    os.utime(partial, (0, 0))
    reopened = DiskTier(tmp_path, 1 << 20, fingerprint)
    assert reopened.keys() == [unit.key]
    assert not partial.exists() and young.exists()
    assert reopened.stats().num_corrupt == 0


def test_two_writers_of_one_unit_leave_one_whole_file(tmp_path: Path, fingerprint: dict) -> None:
    first = DiskTier(tmp_path, 1 << 20, fingerprint)
    second = DiskTier(tmp_path, 1 << 20, fingerprint)
    unit = make_chain(3, 1)[0]
    first.put(unit)
    second.put(unit)
    back = DiskTier(tmp_path, 1 << 20, fingerprint).get(unit.key)
    assert back is not None and back.same_payloads(unit)


def test_the_invariants_see_a_file_gone_behind_the_tiers_back(
    tmp_path: Path, fingerprint: dict
) -> None:
    tier, unit, path = write_one(tmp_path, fingerprint)
    path.unlink()
    with pytest.raises(InvariantError, match=f"unit {unit.key.hex()} indexed, no file"):
        tier.check_invariants()


def test_a_restart_keeps_the_order_of_use(tmp_path: Path, fingerprint: dict) -> None:
    """The scan orders units by their files' last read or write, so the least recently used
    before the restart is the first given up after it."""
    tier = DiskTier(tmp_path, 1 << 20, fingerprint)
    a, b, c = (make_chain(seed, 1)[0] for seed in (1, 2, 3))
    for unit in (a, b, c):
        tier.put(unit)
    for age, unit in enumerate((a, b, c)):
        os.utime(tier.path(unit.key), ns=(10**9 * (age + 1),) * 2)
    tier.get(a.key)  # now the most recently used
    reopened = DiskTier(tmp_path, 2 * FILE_BYTES, fingerprint)
    assert sorted(reopened.keys()) == sorted([a.key, c.key])
    assert reopened.stats().num_evictions == 1
