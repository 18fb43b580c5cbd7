"""Suggested junctions: boundaries that many recorded requests share and no checkpoint covers.

Every finished request reports `attention_match_key`, the key `H_A` of its attention match
`A`, and, when its Mamba hit fell short of `A` (a junction: the attention match reached it,
no checkpoint did), the tokens `[0, A)` as `junction_token_ids`. Grouped by key, the requests
say how often the position came up and what a checkpoint there would have saved them: the
`A - num_cached_tokens` tokens each recomputed. Keys an active, materialized pin already
holds are left out; so are keys whose requests never fell short (nothing to pin there).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy import case, func, select

from api.deps import SessionDep
from api.models import Engine, Pin, PinTarget, Request
from api.schemas import JunctionOut, JunctionPage, JunctionPinRequest

router = APIRouter(prefix="/junctions", tags=["junctions"])


@router.get("/suggested", response_model=JunctionPage)
def suggested_junctions(
    session: SessionDep,
    engine_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> JunctionPage:
    """The junctions worth a pin, most tokens saved first (then most requests); each with the
    `POST /pins` body that pins it. `engine_id` counts only that engine's requests."""
    if engine_id is not None and session.get(Engine, engine_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"engine {engine_id!r} not found")
    match = Request.hit_tokens_by_group["attention"].as_integer()
    is_short = Request.junction_token_ids.is_not(None)
    tokens_saved = func.sum(match - Request.num_cached_tokens)
    num_requests = func.count()
    where = [Request.attention_match_key.is_not(None), match > 0]
    if engine_id is not None:
        where.append(Request.engine_id == engine_id)
    pinned = _pinned_keys(session, engine_id)
    rows = session.execute(
        select(
            Request.attention_match_key,
            func.max(match),
            num_requests,
            func.count(case((is_short, 1))),
            tokens_saved,
            func.min(case((is_short, Request.id))),
        )
        .where(*where)
        .group_by(Request.attention_match_key)
        .having(func.count(case((is_short, 1))) > 0)
        .order_by(tokens_saved.desc(), num_requests.desc(), Request.attention_match_key)
        .limit(limit + len(pinned))
    ).all()
    rows = [row for row in rows if row[0] not in pinned][:limit]
    keys = [row[0] for row in rows]
    engines: dict[str, list[str]] = {}
    for key, seen in session.execute(
        select(Request.attention_match_key, Request.engine_id)
        .where(*where, Request.attention_match_key.in_(keys))
        .group_by(Request.attention_match_key, Request.engine_id)
        .order_by(Request.engine_id)
    ):
        engines.setdefault(key, []).append(seen)
    token_ids = dict(
        session.execute(
            select(Request.id, Request.junction_token_ids).where(
                Request.id.in_([row[5] for row in rows])
            )
        ).all()
    )
    junctions = [
        JunctionOut(
            key=key,
            boundary=boundary,
            num_requests=count,
            num_short_requests=num_short,
            tokens_saved=saved,
            engine_ids=engines.get(key, []),
            pin_request=JunctionPinRequest(
                prefix={"token_ids": token_ids[request_id]}, label=f"junction@{boundary}"
            ),
        )
        for key, boundary, count, num_short, saved, request_id in rows
    ]
    return JunctionPage(engine_id=engine_id, limit=limit, junctions=junctions)


def _pinned_keys(session, engine_id: str | None) -> set[str]:
    """The keys of active pins materialized (on `engine_id`, when given)."""
    stmt = (
        select(PinTarget.keys)
        .join(Pin, Pin.pin_id == PinTarget.pin_id)
        .where(Pin.released_at.is_(None), PinTarget.state == "materialized")
    )
    if engine_id is not None:
        stmt = stmt.where(PinTarget.engine_id == engine_id)
    return {key for keys in session.scalars(stmt) for key in (keys or {}).values()}
