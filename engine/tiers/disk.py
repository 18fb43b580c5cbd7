"""L3: usable-hit units on disk, one file each, surviving a restart.

A unit is `<key hex>.unit` in the directory (`engine.tiers.codec`), written to a temp file and
renamed into place, so several writers and a crash never leave a half-written file under a
final name. Every read checks the file's checksum: a truncated or corrupted file is deleted and
counted (`num_corrupt`), never returned. The directory carries a fingerprint of the model and
geometry (`engine.tiers.fingerprint`); reopening it (a restart) rebuilds the index from the
files' heads, oldest modified first, dropping any whose length does not match its head. Bounded
by `capacity_bytes` of files, giving up least recently used leaves as the host tier does.
Several engines writing one directory never corrupt a file, but each indexes only the files it
found at start and those it wrote: a directory is meant for one engine at a time.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path
from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.hashing import BlockHash
from engine.tiers.codec import CorruptUnitError, decode, encode, read_header
from engine.tiers.counters import TierCounters, TierStats
from engine.tiers.fingerprint import claim, write_atomically
from engine.tiers.index import Record, UnitIndex
from engine.tiers.unit import TierUnit

SUFFIX = ".unit"
STALE_TEMP_SECONDS = 600  # a temp file this old is a dead writer's, not a live one's


class DiskPut(NamedTuple):
    is_stored: bool  # the unit is on disk now (it was already, or it was written)
    evicted: list[BlockHash]  # the units deleted to make room, least recently used first


class DiskTier:
    name = "disk"

    def __init__(self, directory: str | os.PathLike, capacity_bytes: int, fingerprint: dict):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.index = UnitIndex(self.name, capacity_bytes)
        self.counters = TierCounters()
        files = self._unit_files()
        claim(self.directory, fingerprint, has_units=bool(files))
        self._drop_stale_temps()
        self._scan(files)
        self.evict(0)  # a restart with a smaller capacity than the files take

    @property
    def capacity_bytes(self) -> int:
        return self.index.capacity_bytes

    @property
    def num_bytes(self) -> int:
        return self.index.num_bytes

    def path(self, key: BlockHash) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"

    def __contains__(self, key: BlockHash) -> bool:
        return key in self.index

    def contains(self, key: BlockHash) -> bool:
        """Whether the unit is indexed here (its file is read, and checked, only by `get`).
        This operation does not change the tier."""
        return key in self.index

    def keys(self) -> list[BlockHash]:
        return list(self.index.records)

    # ------------------------------------------------------------------ reads and writes
    def put(self, unit: TierUnit) -> DiskPut:
        """Write a unit as the most recently used, deleting leaves to make room. A unit
        already here is only refreshed; one larger than the tier is refused."""
        if unit.key in self.index:
            self.index.touch(unit.key)
            return DiskPut(True, [])
        data = encode(unit)
        if len(data) > self.capacity_bytes:
            self.counters.num_refused += 1
            return DiskPut(False, [])
        evicted = self.evict(len(data), keep=unit.parent)
        if not self.index.can_fit(len(data)):
            self.counters.num_refused += 1
            return DiskPut(False, evicted)
        write_atomically(self.path(unit.key), data)
        self.index.add(unit.key, Record(unit.parent, len(data), unit.start, unit.end))
        self.counters.bytes_in += len(data)
        return DiskPut(True, evicted)

    def get(self, key: BlockHash) -> TierUnit | None:
        """The unit read back and checked, refreshed as the most recently used; None when it
        is not here or its file is corrupt (then the file is deleted and counted)."""
        if key not in self.index:
            self.counters.num_misses += 1
            return None
        try:
            data = self.path(key).read_bytes()
            unit = decode(data, key)
        except (OSError, CorruptUnitError):
            self._drop_corrupt(key)
            self.counters.num_misses += 1
            return None
        self.index.touch(key)
        with suppress(FileNotFoundError):  # another writer's eviction took it meanwhile
            os.utime(self.path(key))  # a restart orders its scan by this
        self.counters.num_hits += 1
        self.counters.bytes_out += len(data)
        return unit

    def remove(self, key: BlockHash) -> bool:
        """Delete the unit's file; False when it was not here."""
        if self.index.discard(key) is None:
            return False
        self.path(key).unlink(missing_ok=True)
        return True

    def evict(self, num_bytes: int, keep: BlockHash | None = None) -> list[BlockHash]:
        """Delete least recently used leaves until `num_bytes` more would fit, or no leaf is
        left; never `keep` (a unit about to gain a child here)."""

        def remove(key: BlockHash) -> BlockHash:
            self.remove(key)
            return key

        evicted = self.index.evict(num_bytes, keep, remove)
        self.counters.num_evictions += len(evicted)
        return evicted

    # ------------------------------------------------------------------ the directory
    def _unit_files(self) -> list[Path]:
        return [p for p in self.directory.iterdir() if p.suffix == SUFFIX and p.is_file()]

    def _drop_stale_temps(self) -> None:
        now = time.time()
        for path in self.directory.glob(".*.tmp"):
            try:
                if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                    path.unlink()
            except FileNotFoundError:  # its writer renamed or removed it meanwhile
                pass

    def _scan(self, files: list[Path]) -> None:
        """Index every intact unit file, least recently modified first."""
        found = []
        for path in files:
            try:
                key = bytes.fromhex(path.stem)
                header = read_header(path, key)
                found.append((path.stat().st_mtime_ns, key, header))
            except (ValueError, OSError):  # CorruptUnitError is a ValueError
                path.unlink(missing_ok=True)
                self.counters.num_corrupt += 1
        for _, key, header in sorted(found, key=lambda item: item[0]):
            self.index.add(key, Record(header.parent, header.file_bytes, header.start, header.end))

    def _drop_corrupt(self, key: BlockHash) -> None:
        self.index.discard(key)
        self.path(key).unlink(missing_ok=True)
        self.counters.num_corrupt += 1

    def stats(self) -> TierStats:
        return self.counters.snapshot(len(self.index), self.num_bytes, self.capacity_bytes)

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first unit whose index and file disagree."""
        self.index.check_invariants()
        on_disk = {bytes.fromhex(path.stem): path for path in self._unit_files()}
        for key in on_disk.keys() ^ self.index.records.keys():
            where = "on disk, not indexed" if key in on_disk else "indexed, no file"
            raise InvariantError(f"disk tier: unit {key.hex()} {where}")
        for key, path in on_disk.items():
            size, indexed = path.stat().st_size, self.index.records[key].num_bytes
            if size != indexed:
                raise InvariantError(
                    f"disk tier: unit {key.hex()} file of {size} bytes, indexed as {indexed}"
                )
