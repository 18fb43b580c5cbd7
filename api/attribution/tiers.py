"""The tier rows of a request's units, read from the engine's `tier_units`: what
`workloads.attribute.splitter` splits an evicted span by (the tier that gave a unit up, or
`not_admitted` past the deepest unit a tier took). An engine whose events never named a tier
unit keeps `evicted` whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.store.models import TierUnit
from workloads.attribute import TierRecord


def has_tiers(session: Session, engine_id: str) -> bool:
    """Whether the engine ever reported a unit below its device (within the kept window)."""
    query = select(TierUnit.unit).where(TierUnit.engine_id == engine_id).limit(1)
    return session.execute(query).first() is not None


def records(session: Session, engine_id: str, units: Iterable[int]) -> dict[int, list[TierRecord]]:
    """The tier rows of the salted `units`, by unit. Reads only."""
    wanted = list(set(units))
    found: dict[int, list[TierRecord]] = {}
    for start in range(0, len(wanted), 10_000):  # SQLite's bound parameters per statement
        query = select(TierUnit.unit, TierUnit.tier, TierUnit.stored_ts, TierUnit.removed_ts).where(
            TierUnit.engine_id == engine_id, TierUnit.unit.in_(wanted[start : start + 10_000])
        )
        for unit, tier, stored_ts, removed_ts in session.execute(query):
            found.setdefault(unit, []).append(TierRecord(tier, stored_ts, removed_ts))
    return found
