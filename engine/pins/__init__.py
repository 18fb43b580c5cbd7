"""Operator pins: a prefix whose Mamba checkpoint and attention blocks are never evicted.

A pin is materialized by a prefill of its prefix up to the boundary (the length floored to the
hit grid); the entries that lookups would follow to that boundary are then pinned, within a cap
on the share of each group's blocks that pins may hold. `PinManager` keeps an engine's pins
through that lifecycle: pending (its prefill queued) -> materialized or failed -> released;
`PinLeases`, the pins a client's cache breakpoint holds for a TTL.
"""

from engine.pins.leases import PinLeases, lease_id
from engine.pins.manager import PinManager, PinPrefill
from engine.pins.pin import Pin, PinState

__all__ = ["Pin", "PinLeases", "PinManager", "PinPrefill", "PinState", "lease_id"]
