"""Hit rates over time: the `RequestFinished` totals of each time bucket."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from api.attribution import hit_rate
from api.deps import READ, EngineDep, SessionDep
from api.openapi import ENGINE_NOT_FOUND, error
from api.schemas import HitRateBucketOut, HitRateOut, HitRateTotals
from api.store.models import HitRateBucket
from engine.events import BELOW_DEVICE
from engine.wire import ATTENTION, MAMBA

router = APIRouter(
    prefix="/engines/{engine_id}/hit-rate",
    tags=["hit-rate"],
    dependencies=[READ],
    responses=ENGINE_NOT_FOUND,
)
COUNTERS = ("num_requests", "prompt_tokens", "cached_tokens", "computed_tokens")


@router.get("", response_model=HitRateOut, responses={400: error("`since` is after `until`")})
def get_hit_rate(
    engine: EngineDep,
    session: SessionDep,
    since: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    until: Annotated[float | None, Query(allow_inf_nan=False)] = None,
) -> HitRateOut:
    """Buckets that overlap `[since, until)` (unix seconds), oldest first, and their total."""
    if since is not None and until is not None and since > until:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"since ({since}) is after until ({until})"
        )
    rows = hit_rate.buckets(session, engine.engine_id, since, until)
    buckets = [
        HitRateBucketOut(
            bucket_start=row.bucket_start, bucket_s=row.bucket_s, **_totals([row]).model_dump()
        )
        for row in rows
    ]
    return HitRateOut(
        engine_id=engine.engine_id, since=since, until=until, total=_totals(rows), buckets=buckets
    )


def _totals(rows: list[HitRateBucket]) -> HitRateTotals:
    sums = {name: sum(getattr(row, name) for row in rows) for name in COUNTERS}
    hits = {
        ATTENTION: sum(row.attention_hit_tokens for row in rows),
        MAMBA: sum(row.mamba_hit_tokens for row in rows),
    }
    prompt = sums["prompt_tokens"]
    tiers = {
        part: {tier: sum(getattr(row, f"{tier}_{part}") for row in rows) for tier in BELOW_DEVICE}
        for part in ("hit_tokens", "loaded_bytes")
    }
    return HitRateTotals(
        **sums,
        hit_tokens_by_tier=tiers["hit_tokens"],
        loaded_bytes_by_tier=tiers["loaded_bytes"],
        hit_tokens_by_group=hits,
        hit_rate=sums["cached_tokens"] / prompt if prompt else 0.0,
        hit_rate_by_group={group: hit / prompt if prompt else 0.0 for group, hit in hits.items()},
    )
