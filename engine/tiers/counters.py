"""What a tier has done, counted as it goes and read as one frozen snapshot."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TierCounters:
    """Running counts a tier adds to; `snapshot` freezes them with the tier's occupancy."""

    bytes_in: int = 0  # unit bytes written into the tier (a put, a demotion, a promotion)
    bytes_out: int = 0  # unit bytes read back out of it (a load)
    num_hits: int = 0  # reads that found their unit
    num_misses: int = 0  # reads that did not (absent, or dropped as corrupt)
    num_evictions: int = 0  # units given up to make room
    num_refused: int = 0  # puts not stored: larger than the tier, or no leaf to give up
    num_corrupt: int = 0  # entries found truncated or corrupted, deleted, never returned

    def snapshot(self, num_units: int, num_bytes: int, capacity_bytes: int) -> TierStats:
        return TierStats(
            num_units=num_units,
            num_bytes=num_bytes,
            capacity_bytes=capacity_bytes,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            num_hits=self.num_hits,
            num_misses=self.num_misses,
            num_evictions=self.num_evictions,
            num_refused=self.num_refused,
            num_corrupt=self.num_corrupt,
        )


@dataclass(frozen=True)
class TierStats:
    num_units: int  # units held now
    num_bytes: int  # bytes they take now (never over `capacity_bytes`)
    capacity_bytes: int
    bytes_in: int
    bytes_out: int
    num_hits: int
    num_misses: int
    num_evictions: int
    num_refused: int
    num_corrupt: int


#: upper bounds (seconds) of the read-time histogram's buckets: a host read of a unit takes
#: microseconds, a disk read milliseconds
READ_SECONDS_BUCKETS = (1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


@dataclass(slots=True)
class ReadTimes:
    """How long reading units out of one tier took, as a fixed histogram (bounded)."""

    counts: list[int]  # per bucket of `READ_SECONDS_BUCKETS`, then one past the last
    total_s: float = 0.0

    @classmethod
    def empty(cls) -> ReadTimes:
        return cls([0] * (len(READ_SECONDS_BUCKETS) + 1))

    def add(self, seconds: float) -> None:
        index = next(
            (i for i, bound in enumerate(READ_SECONDS_BUCKETS) if seconds <= bound),
            len(READ_SECONDS_BUCKETS),
        )
        self.counts[index] += 1
        self.total_s += seconds
