"""`PinLeases`: pins that hold for a while (a client's cache breakpoint with its TTL: issue 51).

A lease names a pin and when it ends. Leasing a pin again, or a request hitting it, moves the
end to a full TTL from then (never earlier); once it passes, the engine releases the pin and
its blocks are kept and evicted like any others (down a tier first, where there is one). The
ids are the pinned prefix's own (`lease_id`), so every request that marks the same prefix
renews one lease instead of adding pins. The clock is the caller's, so a test can move it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.hashing import BlockHash

PREFIX = "ttl-"
MAX_LEASES = 4096  # distinct prefixes held at once; a new one past this is not pinned


def lease_id(key: BlockHash) -> str:
    """The pin id of a lease on the prefix whose last unit hashes to `key`."""
    return PREFIX + key.hex()[:16]


@dataclass
class PinLeases:
    ttl_s: dict[str, float] = field(default_factory=dict)
    ends_at: dict[str, float] = field(default_factory=dict)
    max_leases: int = MAX_LEASES

    def has_room(self, pin_id: str) -> bool:
        return pin_id in self.ends_at or len(self.ends_at) < self.max_leases

    def __contains__(self, pin_id: str) -> bool:
        return pin_id in self.ends_at

    def lease(self, pin_id: str, ttl_s: float, now: float) -> None:
        """Hold `pin_id` until `ttl_s` from `now` at least (a longer TTL asked earlier stays)."""
        if ttl_s <= 0:
            raise ValueError(f"a lease's ttl_s must be > 0, got {ttl_s}")
        self.ttl_s[pin_id] = max(ttl_s, self.ttl_s.get(pin_id, 0.0))
        self.ends_at[pin_id] = max(now + ttl_s, self.ends_at.get(pin_id, now))

    def renew(self, pin_ids: object, now: float) -> None:
        """Pins a request hit: each leased one holds its full TTL from `now`."""
        for pin_id in pin_ids:
            if pin_id in self.ends_at:
                self.ends_at[pin_id] = max(self.ends_at[pin_id], now + self.ttl_s[pin_id])

    def ended(self, now: float) -> list[str]:
        """The leases that ended by `now`, forgotten here."""
        done = [pin_id for pin_id, end in self.ends_at.items() if end <= now]
        for pin_id in done:
            self.drop(pin_id)
        return done

    def drop(self, pin_id: str) -> None:
        self.ttl_s.pop(pin_id, None)
        self.ends_at.pop(pin_id, None)
