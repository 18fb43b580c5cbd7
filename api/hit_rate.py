"""An engine's hit-rate buckets in the store: the `RequestFinished` totals of each time bucket."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.models import HitRateBucket


def buckets(
    session: Session, engine_id: str, since: float | None, until: float | None
) -> list[HitRateBucket]:
    """The engine's buckets that overlap `[since, until)` (unix seconds; None: unbounded),
    oldest first."""
    stmt = select(HitRateBucket).where(HitRateBucket.engine_id == engine_id)
    if since is not None:
        stmt = stmt.where(HitRateBucket.bucket_start + HitRateBucket.bucket_s > since)
    if until is not None:
        stmt = stmt.where(HitRateBucket.bucket_start < until)
    return list(session.scalars(stmt.order_by(HitRateBucket.bucket_start)))
