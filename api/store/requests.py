"""An engine's finished requests in the store, newest first, with their miss attribution."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from api.attribution.misses import REASONS
from api.schemas import MatchStopOut, RequestAttribution, RequestOut
from api.store.models import Attribution, PendingAttribution, Request
from api.store.paging import fetch_page


def request_page(
    session: Session, engine_id: str, offset: int, limit: int
) -> tuple[int, Sequence[Request]]:
    """(how many finished requests the engine has, the `limit` newest after `offset`)."""
    where = [Request.engine_id == engine_id]
    order = (Request.finished_ts.desc(), Request.id.desc())
    return fetch_page(session, Request, where, order, offset, limit)


def latest_request(session: Session, engine_id: str, request_id: str) -> Request | None:
    """The request's latest record (an id may come back in a later epoch), or None."""
    return session.scalar(
        select(Request)
        .where(Request.engine_id == engine_id, Request.request_id == request_id)
        .order_by(Request.id.desc())
        .limit(1)
    )


def request_outs(session: Session, engine_id: str, rows: Sequence[Request]) -> list[RequestOut]:
    """The rows as the REST API serves them, each with its `attribution` (two reads for all)."""
    keys = [(r.epoch, r.arrival_index) for r in rows if r.arrival_index is not None]
    done = {
        (a.epoch, a.arrival_index): a
        for a in session.scalars(select(Attribution).where(*_among(Attribution, engine_id, keys)))
    }
    pending = set(
        session.execute(
            select(PendingAttribution.epoch, PendingAttribution.arrival_index).where(
                *_among(PendingAttribution, engine_id, keys)
            )
        )
    )
    outs = []
    for row in rows:
        out = RequestOut.model_validate(row)
        key = (row.epoch, row.arrival_index)
        if out.match_stop is not None and (key in done or key in pending):
            out.attribution = _attribution(done.get(key), out.match_stop)
        outs.append(out)
    return outs


def _among(table: type[Attribution | PendingAttribution], engine_id: str, keys: list) -> list:
    """The conditions for the engine's rows of `table` keyed by one of `keys`."""
    return [table.engine_id == engine_id, tuple_(table.epoch, table.arrival_index).in_(keys)]


def _attribution(done: Attribution | None, stop: MatchStopOut) -> RequestAttribution:
    """A request's attribution: `done` (its row), or pending when None."""
    return RequestAttribution(
        state="attributed" if done else "pending",
        shared_tokens=done.shared_tokens if done else None,
        oracle_tokens=done.oracle_tokens if done else None,
        missed_tokens={r: getattr(done, f"missed_{r}") for r in REASONS} if done else None,
        stop_reason=stop.reason,
        copy_wait_steps=stop.copy_wait_steps,
    )
