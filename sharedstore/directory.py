"""The shared tier in a directory: engines on one machine share units without a service.

The units of one fingerprint live in `<directory>/<fingerprint>/`, one file each in the disk
tier's format (`engine.tiers.codec`: a checksum over the whole body, the unit's record in its
header), written to a temp file and renamed into place (`write_atomically`), so several writers
never leave part of a file under a final name. A file's modification time is its last use: a
read touches it. There is no index to keep consistent between processes: each writer, before a
write, lists the directory and deletes the least recently used files until its own fits under
the bound (a file another writer deleted meanwhile is simply gone), and deletes files older
than the time to live. A reader tolerates a file vanishing under it (a miss). Concurrent
writers may together overshoot the bound by at most the files written between two listings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from engine.hashing import BlockHash
from engine.tiers.codec import CorruptUnitError, read_header
from engine.tiers.disk import STALE_TEMP_SECONDS, SUFFIX
from engine.tiers.fingerprint import write_atomically
from engine.tiers.index import Record
from engine.tiers.shared import SharedStoreError, StorePut


class DirectoryStore:
    def __init__(
        self, directory: str | os.PathLike, namespace: str, capacity_bytes: int, ttl_s: int
    ):
        self.root = Path(directory)
        self.directory = self.root / namespace
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"--shared-cache-url {directory}: cannot create {self.directory} ({error}); "
                "pass a directory this user may write"
            ) from None

    def describe(self) -> str:
        return f"file://{self.root}"

    def path(self, key: BlockHash) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"

    def records(self, keys: Sequence[BlockHash]) -> dict[BlockHash, Record]:
        found, expired_before = {}, time.time() - self.ttl_s
        for key in keys:
            path = self.path(key)
            try:
                if path.stat().st_mtime < expired_before:
                    continue
                header = read_header(path, key)
            except (OSError, CorruptUnitError):  # gone, being replaced, or corrupt
                continue
            found[key] = Record(header.parent, header.file_bytes, header.start, header.end)
        return found

    def get(self, key: BlockHash) -> bytes | None:
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise SharedStoreError(repr(error)) from None
        with suppress(OSError):  # another writer's eviction took it meanwhile
            os.utime(path)
        return data

    def put(self, key: BlockHash, record: Record, data: bytes) -> StorePut:
        path = self.path(key)
        try:
            with suppress(FileNotFoundError):  # else it is written below
                os.utime(path)
                return StorePut(True, *self.usage())
            if len(data) > self.capacity_bytes:
                return StorePut(False, *self.usage())
            num_units, num_bytes = self._make_room(len(data))
            write_atomically(path, data)
        except OSError as error:
            raise SharedStoreError(repr(error)) from None
        return StorePut(True, num_units + 1, num_bytes + len(data))

    def remove(self, key: BlockHash) -> None:
        self.path(key).unlink(missing_ok=True)

    # ------------------------------------------------------------------ the bound
    def _files(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every unit file, least recently used first; files that
        vanish while listed are left out."""
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not entry.name.endswith(SUFFIX):
                    if entry.name.endswith(".tmp"):
                        self._drop_stale_temp(entry)
                    continue
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        return sorted(found)

    @staticmethod
    def _drop_stale_temp(entry: os.DirEntry) -> None:
        with suppress(FileNotFoundError):
            if time.time() - entry.stat().st_mtime > STALE_TEMP_SECONDS:
                os.unlink(entry.path)

    def _make_room(self, num_bytes: int) -> tuple[int, int]:
        """Delete expired files, then least recently used ones until `num_bytes` more fit;
        the files and bytes left."""
        files = self._files()
        expired_before = time.time() - self.ttl_s
        count, total = len(files), sum(size for _, size, _ in files)
        for used, size, path in files:
            if used >= expired_before and total + num_bytes <= self.capacity_bytes:
                break
            path.unlink(missing_ok=True)
            count, total = count - 1, total - size
        return count, total

    def usage(self) -> tuple[int, int]:
        """The units and bytes the directory holds for this namespace now."""
        files = self._files()
        return len(files), sum(size for _, size, _ in files)

    def close(self) -> None:
        pass
