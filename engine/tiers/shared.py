"""The shared tier: usable-hit units in a store that every engine of one model and geometry
reads and writes (issue 49), below host memory and disk.

The engine sees a `SharedStore`: bytes by unit key, in one namespace per fingerprint of the
model and geometry, with each entry's `Record` (parent, range, bytes) readable without its
bytes. Its backends (Redis, a directory several engines share) live outside the engine
(`sharedstore`), which hands one in. `SharedTier` puts units there in the disk tier's file
format (`engine.tiers.codec`) with the fingerprint in the metadata, and reads them back
checked: a corrupt entry, or one written for another fingerprint, is removed, counted and never
returned; one whose range is not the record the lookup planned with (another engine rewrote it
meanwhile) is a miss.

A store that fails (down, slow past its per-call timeout) costs hits, never a request: every
call's failure is caught, counted, and said once in the log (and once more when the store is
back); while it is down a call is tried at most once per `RETRY_SECONDS`, so a dead store
costs the scheduler one timeout per interval, not one per lookup.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from engine.hashing import BlockHash
from engine.tiers.codec import CorruptUnitError, ForeignUnitError, decode, encode
from engine.tiers.counters import TierCounters, TierStats
from engine.tiers.index import Record
from engine.tiers.unit import TierUnit

SHARED = "shared"
RETRY_SECONDS = 1.0  # while the store is down, the least time between two tries
MAX_KNOWN = 1 << 16  # keys remembered as put, so a unit is not sent twice

log = logging.getLogger("junction.shared")


class SharedStoreError(Exception):
    """A shared store's call failed (unreachable, timed out, refused): a miss, never a fault."""


class StorePut(NamedTuple):
    is_stored: bool  # the entry is in the store now
    num_units: int  # what the store holds after the put, as it counts them
    num_bytes: int


class SharedStore(Protocol):
    """A backend: entries by key within one fingerprint's namespace, bounded in bytes, each
    with a time to live. Every method raises `SharedStoreError` when the store fails."""

    capacity_bytes: int

    def describe(self) -> str: ...

    def records(self, keys: Sequence[BlockHash]) -> dict[BlockHash, Record]: ...

    def get(self, key: BlockHash) -> bytes | None: ...

    def put(self, key: BlockHash, record: Record, data: bytes) -> StorePut: ...

    def remove(self, key: BlockHash) -> None: ...


@dataclass(frozen=True)
class SharedStats:
    tier: TierStats  # units and bytes as of the last put (the store is shared: others add)
    is_up: bool
    num_errors: int  # calls that failed
    num_foreign: int  # entries dropped as written for another fingerprint
    num_stale: int  # entries read whose range was not the one planned (rewritten meanwhile)
    url: str


class SharedTier:
    name = SHARED

    def __init__(self, store: SharedStore, fingerprint: str) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.counters = TierCounters()
        # put by us, or seen there, with its encoded bytes (what a router prices its load by)
        self.known: OrderedDict[BlockHash, int] = OrderedDict()
        self.is_up = True
        self.num_errors = self.num_foreign = self.num_stale = 0
        self.num_units = self.num_bytes = 0
        self._retry_at = 0.0

    # ------------------------------------------------------------------ the store's health
    def _ready(self) -> bool:
        return self.is_up or time.monotonic() >= self._retry_at

    def _failed(self, what: str, error: Exception) -> None:
        self.num_errors += 1
        self._retry_at = time.monotonic() + RETRY_SECONDS
        if self.is_up:
            self.is_up = False
            log.warning(
                "shared cache %s is down (%s: %s); hits from it are lost until it is back",
                self.store.describe(),
                what,
                error,
            )

    def _succeeded(self) -> None:
        if not self.is_up:
            self.is_up = True
            log.warning("shared cache %s is back", self.store.describe())

    # ------------------------------------------------------------------ reads and writes
    def records(self, keys: Sequence[BlockHash]) -> dict[BlockHash, Record]:
        """The records of those of `keys` the store holds; empty when it fails."""
        if not keys or not self._ready():
            return {}
        try:
            found = self.store.records(keys)
        except SharedStoreError as error:
            self._failed("lookup", error)
            return {}
        self._succeeded()
        return found

    def put(self, unit: TierUnit) -> bool:
        """Send a unit to the store; whether it was stored now (False when this engine put it
        already, the store refused it, or failed)."""
        if unit.key in self.known or not self._ready():
            return False
        data = encode(unit, self.fingerprint)
        record = Record(unit.parent, len(data), unit.start, unit.end)
        try:
            result = self.store.put(unit.key, record, data)
        except SharedStoreError as error:
            self._failed("put", error)
            return False
        self._succeeded()
        self.num_units, self.num_bytes = result.num_units, result.num_bytes
        if not result.is_stored:
            self.counters.num_refused += 1
            return False
        self._remember(unit.key, len(data))
        self.counters.bytes_in += len(data)
        return True

    def get(self, key: BlockHash, record: Record) -> TierUnit | None:
        """The unit read back and checked against `record` (what the lookup planned with);
        None when it is gone, corrupt, foreign, another unit than planned, or the store fails."""
        if not self._ready():
            self.counters.num_misses += 1
            return None
        try:
            data = self.store.get(key)
            unit = None if data is None else decode(data, key, self.fingerprint)
        except SharedStoreError as error:
            self._failed("get", error)
            unit = data = None
        except CorruptUnitError as error:
            self._drop(key, error)
            unit = data = None
        else:
            self._succeeded()
        if unit is not None and (unit.parent, unit.start, unit.end) != (
            record.parent,
            record.start,
            record.end,
        ):
            self.num_stale += 1
            unit = None
        if unit is None or data is None:
            self.counters.num_misses += 1
            return None
        self._remember(key, len(data))
        self.counters.num_hits += 1
        self.counters.bytes_out += len(data)
        return unit

    def _drop(self, key: BlockHash, error: CorruptUnitError) -> None:
        if isinstance(error, ForeignUnitError):
            self.num_foreign += 1
        else:
            self.counters.num_corrupt += 1
        log.warning("shared cache: dropped %s", error)
        self.known.pop(key, None)
        try:
            self.store.remove(key)
        except SharedStoreError as failure:
            self._failed("remove", failure)

    @property
    def ttl_s(self) -> float | None:
        """How long an entry outlives its last use, where the store says."""
        return getattr(self.store, "ttl_s", None)

    def _remember(self, key: BlockHash, num_bytes: int) -> None:
        self.known[key] = num_bytes
        self.known.move_to_end(key)
        if len(self.known) > MAX_KNOWN:
            self.known.popitem(last=False)

    def stats(self) -> SharedStats:
        tier = self.counters.snapshot(self.num_units, self.num_bytes, self.store.capacity_bytes)
        return SharedStats(
            tier,
            self.is_up,
            self.num_errors,
            self.num_foreign,
            self.num_stale,
            self.store.describe(),
        )
