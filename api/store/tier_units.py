"""An engine's tiers below the device as the REST API serves them (`GET .../blocks/tiers`):
each tier's usage now and a page of the units held now. Reads only."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.store.models import TierUnit
from api.store.paging import fetch_page
from engine.events import BELOW_DEVICE

Usage = tuple[int, int]  # (units, tokens of attention they carry)


def usage(session: Session, engine_id: str) -> dict[str, Usage]:
    """The units each tier holds now, and their tokens."""
    query = (
        select(
            TierUnit.tier,
            func.count(),
            func.coalesce(func.sum(TierUnit.token_end - TierUnit.token_start), 0),
        )
        .where(TierUnit.engine_id == engine_id, TierUnit.removed_ts.is_(None))
        .group_by(TierUnit.tier)
    )
    held = {tier: (units, tokens) for tier, units, tokens in session.execute(query)}
    order = {tier: i for i, tier in enumerate(BELOW_DEVICE)}
    return dict(sorted(held.items(), key=lambda item: order.get(item[0], len(order))))


def unit_page(
    session: Session, engine_id: str, tier: str | None, offset: int, limit: int
) -> tuple[int, Sequence[TierUnit]]:
    """(how many units the engine's tiers hold now, the `limit` of them after `offset`), by
    tier then token range; `tier` (None: every tier) filters them."""
    where = [TierUnit.engine_id == engine_id, TierUnit.removed_ts.is_(None)]
    if tier is not None:
        where.append(TierUnit.tier == tier)
    order = (TierUnit.tier, TierUnit.token_start, TierUnit.token_end, TierUnit.unit_key)
    return fetch_page(session, TierUnit, where, order, offset, limit)
