"""Miss attribution over time: the attributed requests' totals in the hit rate's buckets."""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from api.attribution import hit_rate
from api.deps import READ, EngineDep, SessionDep
from api.openapi import ENGINE_NOT_FOUND, error
from api.schemas import AttributionBucketOut, AttributionOut, AttributionTotals
from api.store.models import HitRateBucket
from workloads.misses import REASONS

router = APIRouter(
    prefix="/engines/{engine_id}/attribution",
    tags=["attribution"],
    dependencies=[READ],
    responses=ENGINE_NOT_FOUND,
)


@router.get("", response_model=AttributionOut, responses={400: error("`since` is after `until`")})
def get_attribution(
    engine: EngineDep,
    session: SessionDep,
    since: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    until: Annotated[float | None, Query(allow_inf_nan=False)] = None,
) -> AttributionOut:
    """Buckets that overlap `[since, until)` (unix seconds), oldest first, and their total:
    attributed requests only; `num_pending` counts the others."""
    if since is not None and until is not None and since > until:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"since ({since}) is after until ({until})"
        )
    rows = hit_rate.buckets(session, engine.engine_id, since, until)
    finished = hit_rate.pending_finished_ts(session, engine.engine_id)
    widths = {row.bucket_s for row in rows}
    pending = Counter((math.floor(ts / w) * w, w) for w in widths for ts in finished)
    buckets = [
        AttributionBucketOut(
            bucket_start=row.bucket_start,
            bucket_s=row.bucket_s,
            **_totals([row], pending[(row.bucket_start, row.bucket_s)]).model_dump(),
        )
        for row in rows
    ]
    total = _totals(rows, sum(bucket.num_pending for bucket in buckets))
    return AttributionOut(
        engine_id=engine.engine_id, since=since, until=until, total=total, buckets=buckets
    )


def _totals(rows: list[HitRateBucket], num_pending: int) -> AttributionTotals:
    def total(name: str) -> int:
        return sum(getattr(row, name) for row in rows)

    return AttributionTotals(
        num_requests=total("attributed_requests"),
        prompt_tokens=total("attributed_prompt_tokens"),
        hit_tokens=total("attributed_hit_tokens"),
        shared_tokens=total("shared_tokens"),
        oracle_tokens=total("oracle_tokens"),
        missed_tokens={reason: total(f"missed_{reason}") for reason in REASONS},
        num_pending=num_pending,
    )
