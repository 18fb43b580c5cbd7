"""An engine's hit-rate buckets in the store: the `RequestFinished` totals of each time bucket,
and the miss attribution's totals of the bucket's attributed requests (`api.attribution`)."""

from __future__ import annotations

import math

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from api.misses import REASONS
from api.models import HitRateBucket, PendingAttribution

BUCKETS: Table = HitRateBucket.__table__
HIT_COUNTERS = (
    "num_requests",
    "prompt_tokens",
    "cached_tokens",
    "attention_hit_tokens",
    "mamba_hit_tokens",
    "computed_tokens",
)
ATTRIBUTION_COUNTERS = (
    "attributed_requests",
    "attributed_prompt_tokens",
    "attributed_hit_tokens",
    "shared_tokens",
    "oracle_tokens",
    *(f"missed_{reason}" for reason in REASONS),
)
COUNTERS = HIT_COUNTERS + ATTRIBUTION_COUNTERS


def bucket_row(buckets: dict[int, dict], engine_id: str, ts: float, bucket_s: int) -> dict:
    """The row of `buckets` (bucket start -> row) that `ts` falls in, added with every counter
    0 when missing: `bulk.upsert(..., increment=COUNTERS)` adds them to the stored ones."""
    start = math.floor(ts / bucket_s) * bucket_s
    row = buckets.get(start)
    if row is None:
        row = buckets[start] = {
            "engine_id": engine_id,
            "bucket_start": start,
            "bucket_s": bucket_s,
        } | dict.fromkeys(COUNTERS, 0)
    return row


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


def pending_finished_ts(session: Session, engine_id: str) -> list[float]:
    """When each of the engine's requests still pending attribution finished."""
    stmt = select(PendingAttribution.finished_ts).where(PendingAttribution.engine_id == engine_id)
    return list(session.scalars(stmt))
