"""Where an evicted prefix went: the `evicted` span of a request's misses split by the tiers
below the device (`api.attribution.misses`), from the engine's `tier_units`.

The span `[start, end)` had been cached on the device and was gone when the request came. Its
units are the request's chain at positions `p` (multiples of `U`); a tier holds a unit `H_p`
for the attention of `[q, p)` and the state at `p`. The deepest `p` in `(start, end]` whose unit
some tier took before the request came splits the span:

    [start, p)   the tier that gave that unit up last before the request came:
                 `evicted_host`, `evicted_disk` or `evicted_shared`; still held by one then
                 (the load was refused as slower than its prefill, or its chain was broken):
                 `evicted`, as without tiers
    [p, end)     `not_admitted`: no tier took these units (the state was unbacked, declined
                 by the eviction policy, refused by a full tier) before the request came

An engine whose events never named a tier unit keeps `evicted` whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.attribution.misses import Below
from api.store.models import TierUnit


class TierRecord(NamedTuple):
    tier: str
    stored_ts: float
    removed_ts: float | None


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


def splitter(
    units: list[int], arrival_ts: float, unit: int, found: dict[int, list[TierRecord]]
) -> Below:
    """`split_misses`' `below` for a request of chain `units` that came at `arrival_ts`, on an
    engine of match unit `unit`."""

    def below(start: int, end: int) -> dict[str, int]:
        for position in range(end // unit * unit, start, -unit):
            index = position // unit - 1
            if index >= len(units):
                continue
            taken = [r for r in found.get(units[index], ()) if r.stored_ts < arrival_ts]
            if taken:
                reason = _reason(taken, arrival_ts)
                return {reason: position - start, "not_admitted": end - position}
        return {"not_admitted": end - start}

    return below


def _reason(taken: list[TierRecord], arrival_ts: float) -> str:
    if any(r.removed_ts is None or r.removed_ts >= arrival_ts for r in taken):
        return "evicted"  # a tier still held it when the request came
    last = max(taken, key=lambda r: r.removed_ts or 0.0)
    return f"evicted_{last.tier}"
