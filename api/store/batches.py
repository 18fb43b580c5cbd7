"""The stored event batches, as they came, for readers that follow an engine's stream."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.store.models import Engine, EventBatch


def engine_batches(
    session: Session, engine_id: str, epoch: int, after_seq: int, limit: int
) -> list[EventBatch]:
    """Up to `limit` of the engine's batches in `epoch` with `seq > after_seq`, in seq order."""
    stmt = (
        select(EventBatch)
        .where(
            EventBatch.seq > after_seq,
            EventBatch.engine_id == engine_id,
            EventBatch.epoch == epoch,
        )
        .order_by(EventBatch.seq)
    )
    return list(session.scalars(stmt.limit(limit)))


def current_batches(session: Session, after_seq: int, limit: int) -> list[EventBatch]:
    """Up to `limit` batches with `seq > after_seq` of every engine's current epoch, in
    arrival order."""
    current = (Engine.engine_id == EventBatch.engine_id) & (Engine.epoch == EventBatch.epoch)
    stmt = (
        select(EventBatch)
        .where(EventBatch.seq > after_seq)
        .join(Engine, current)
        .order_by(EventBatch.id)
    )
    return list(session.scalars(stmt.limit(limit)))
