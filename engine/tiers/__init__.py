"""The cache below the device pools (issue 46, first step): L2 in host memory (`HostTier`), L3
on disk (`DiskTier`), and the moves between them (`TierStack`). What a tier keeps is a
usable-hit unit (`TierUnit`): the attention blocks since the unit before it together with the
recurrent state at its end, keyed by the chain hash of its last match unit, so a tier never
spends bytes on attention that no state backs nor on a state whose prefix is gone. Each tier is
bounded in bytes at every moment and gives up least recently used leaves first (`UnitIndex`),
so a unit's ancestors outlive it; the disk tier checks a checksum on every read and refuses a
directory written for another model or geometry. Nothing here knows the device pools, the
scheduler or the runners: they hand units in and take them back out.
"""

from engine.tiers.counters import TierStats
from engine.tiers.disk import DiskPut, DiskTier
from engine.tiers.host import HostPut, HostTier
from engine.tiers.stack import StackStats, TierHit, TierStack
from engine.tiers.unit import Payload, TierUnit

__all__ = [
    "DiskPut",
    "DiskTier",
    "HostPut",
    "HostTier",
    "Payload",
    "StackStats",
    "TierHit",
    "TierStack",
    "TierStats",
    "TierUnit",
]
