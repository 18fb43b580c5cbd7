"""An engine's finished requests in the store, newest first (their miss attribution added as
the REST API serves them by `api.routes.requests`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.store.models import Request
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
