"""Suggested junctions: boundaries that many recorded requests share and no checkpoint covers.

Every finished request reports `attention_match_key`, the key `H_A` of its attention match
`A`, and, when its Mamba hit fell short of `A` (a junction: the attention match reached it,
no checkpoint did), the tokens `[0, A)` as `junction_token_ids`. Grouped by key, the requests
say how often the position came up and what a checkpoint there would have saved them: the
`A - num_cached_tokens` tokens each recomputed. Keys an active, materialized pin already
holds are left out; so are keys whose requests never fell short (nothing to pin there), and
boundaries shorter than `MIN_BOUNDARY` tokens: a pin saves at most its boundary per request,
and the shortest shared prefixes are a chat template's header and a system prompt's first
words ("<|system|>\nYou a"), shared by every chat and worth nothing.
This operation reads the store and changes nothing.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from api.store.models import Pin, PinTarget, Request
from engine.events import ATTENTION

#: The shortest boundary suggested by default (`GET /junctions/suggested?min_tokens=`).
MIN_BOUNDARY = 64


class Junction(NamedTuple):
    key: str  # the attention match key H_A the requests share
    boundary: int  # A, the tokens of the attention match
    num_requests: int  # requests whose attention match was this key
    num_short_requests: int  # those whose Mamba hit fell short of A
    tokens_saved: int  # what a checkpoint at A would have saved them, summed
    engine_ids: list[str]  # the engines that served them, by id
    token_ids: list[int]  # the prefix [0, A), from one short request


def suggested_junctions(
    session: Session, engine_id: str | None, limit: int, min_tokens: int = MIN_BOUNDARY
) -> list[Junction]:
    """Up to `limit` junctions of at least `min_tokens` tokens, most tokens saved first (then
    most requests, then key); `engine_id` counts only that engine's requests."""
    match = Request.hit_tokens_by_group[ATTENTION].as_integer()
    is_short = Request.junction_token_ids.is_not(None)
    tokens_saved = func.sum(match - Request.num_cached_tokens)
    num_requests = func.count()
    where = [Request.attention_match_key.is_not(None), match >= max(min_tokens, 1)]
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
    return [
        Junction(key, boundary, count, num_short, saved, engines.get(key, []), token_ids[row_id])
        for key, boundary, count, num_short, saved, row_id in rows
    ]


def _pinned_keys(session: Session, engine_id: str | None) -> set[str]:
    """The keys of active pins materialized (on `engine_id`, when given)."""
    stmt = (
        select(PinTarget.keys)
        .join(Pin, Pin.pin_id == PinTarget.pin_id)
        .where(Pin.released_at.is_(None), PinTarget.state == "materialized")
    )
    if engine_id is not None:
        stmt = stmt.where(PinTarget.engine_id == engine_id)
    return {key for keys in session.scalars(stmt) for key in (keys or {}).values()}
