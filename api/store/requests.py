"""An engine's finished requests in the store, newest first, and their miss attribution."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

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


def attributions(
    session: Session, engine_id: str, rows: Sequence[Request]
) -> tuple[dict[tuple[int, int], Attribution], set[tuple[int, int]]]:
    """The attribution rows of the requests `rows`, by (epoch, arrival index), and the keys of
    those whose attribution is still pending (two reads for all)."""
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
    return done, pending


def _among(table: type[Attribution | PendingAttribution], engine_id: str, keys: list) -> list:
    """The conditions for the engine's rows of `table` keyed by one of `keys`."""
    return [table.engine_id == engine_id, tuple_(table.epoch, table.arrival_index).in_(keys)]
