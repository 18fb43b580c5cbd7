"""An engine's hit-rate buckets in the store: the `RequestFinished` totals of each time bucket,
and the miss attribution's totals of the bucket's attributed requests (`api.attribution.record`).

Ingest writes buckets of `JUNCTION_HIT_RATE_BUCKET_S`; retention (`api.retention`) rolls the
old ones up into buckets of `JUNCTION_RETENTION_ROLLUP_BUCKET_S` (`roll_up`), so a series
mixes widths: each row says its own `bucket_s`, and a rate is a row's counter over its own
width. A row ingest adds late inside a rolled-up bucket's span (a request attributed long
after it finished) overlaps it until the next round rolls it in; `buckets` reads it folded
into the coarse one, so readers never see two buckets over one instant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from api.store import bulk
from api.store.models import HitRateBucket, PendingAttribution
from engine.events import BELOW_DEVICE
from workloads.misses import REASONS

BUCKETS: Table = HitRateBucket.__table__
HIT_COUNTERS = (
    "num_requests",
    "prompt_tokens",
    "cached_tokens",
    "attention_hit_tokens",
    "mamba_hit_tokens",
    "computed_tokens",
    # what the tiers below the device served, by the batch that loaded it (`api.ingest.tiers`)
    *(f"{tier}_hit_tokens" for tier in BELOW_DEVICE),
    *(f"{tier}_loaded_bytes" for tier in BELOW_DEVICE),
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
#: `bulk.upsert(..., merge=KEEP_WIDEST)`: a fine row added onto a rolled-up one keeps its width
KEEP_WIDEST = {
    "bucket_s": "CASE WHEN {old}.bucket_s > {new}.bucket_s THEN {old}.bucket_s"
    " ELSE {new}.bucket_s END"
}


def bucket_row(buckets: dict[int, dict], engine_id: str, ts: float, bucket_s: int) -> dict:
    """The row of `buckets` (bucket start -> row) that `ts` falls in, added with every counter
    0 when missing: `add_buckets` adds them to the stored ones."""
    start = math.floor(ts / bucket_s) * bucket_s
    row = buckets.get(start)
    if row is None:
        row = buckets[start] = {
            "engine_id": engine_id,
            "bucket_start": start,
            "bucket_s": bucket_s,
        } | dict.fromkeys(COUNTERS, 0)
    return row


def add_buckets(session: Session, buckets: dict[int, dict]) -> None:
    """Add the counters of `buckets` (`bucket_row`'s) onto the stored rows, in one statement;
    a fine row added onto one already rolled up keeps the wider width (`KEEP_WIDEST`)."""
    bulk.upsert(session, BUCKETS, list(buckets.values()), increment=COUNTERS, merge=KEEP_WIDEST)


def roll_up(rows: Iterable[Mapping], bucket_s: int) -> list[dict]:
    """`rows` (bucket rows of one engine, any widths) summed into rows of `bucket_s`, one per
    coarse start a row's own start falls in, every counter added: the totals do not change.
    This operation will not modify the store."""
    coarse: dict[int, dict] = {}
    for row in rows:
        start = math.floor(row["bucket_start"] / bucket_s) * bucket_s
        into = coarse.setdefault(
            start,
            {"engine_id": row["engine_id"], "bucket_start": start, "bucket_s": bucket_s}
            | dict.fromkeys(COUNTERS, 0),
        )
        for name in COUNTERS:
            into[name] += row[name]
    return [coarse[start] for start in sorted(coarse)]


def buckets(
    session: Session, engine_id: str, since: float | None, until: float | None
) -> list[HitRateBucket]:
    """The engine's buckets that overlap `[since, until)` (unix seconds; None: unbounded),
    oldest first, none overlapping another: a row that starts inside an earlier (rolled-up)
    row's span is read as part of it (an unsaved copy, never written back)."""
    stmt = select(HitRateBucket).where(HitRateBucket.engine_id == engine_id)
    if since is not None:
        stmt = stmt.where(HitRateBucket.bucket_start + HitRateBucket.bucket_s > since)
    if until is not None:
        stmt = stmt.where(HitRateBucket.bucket_start < until)
    rows: list[HitRateBucket] = []
    for row in session.scalars(stmt.order_by(HitRateBucket.bucket_start)):
        last = rows[-1] if rows else None
        if last is None or row.bucket_start >= last.bucket_start + last.bucket_s:
            rows.append(row)
            continue
        end = max(last.bucket_start + last.bucket_s, row.bucket_start + row.bucket_s)
        merged = HitRateBucket(  # transient: in no session, so nothing flushes it
            engine_id=engine_id,
            bucket_start=last.bucket_start,
            bucket_s=end - last.bucket_start,
            **{name: getattr(last, name) + getattr(row, name) for name in COUNTERS},
        )
        rows[-1] = merged
    return rows


def pending_finished_ts(session: Session, engine_id: str) -> list[float]:
    """When each of the engine's requests still pending attribution finished."""
    stmt = select(PendingAttribution.finished_ts).where(PendingAttribution.engine_id == engine_id)
    return list(session.scalars(stmt))
