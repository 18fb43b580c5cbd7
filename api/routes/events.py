"""The event batches as they came, for readers that follow an engine's stream."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy import select

from api.deps import MAX_INT64, SessionDep
from api.models import Engine, EventBatch
from api.schemas import BatchOut, EventPage

router = APIRouter(prefix="/events", tags=["events"])


@router.get("", response_model=EventPage)
def list_events(
    session: SessionDep,
    engine_id: str | None = None,
    epoch: Annotated[
        int | None, Query(ge=0, le=MAX_INT64, description="default: the current epoch")
    ] = None,
    after_seq: Annotated[int, Query(ge=-1, le=MAX_INT64)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventPage:
    """Batches with `seq > after_seq` in seq order; without `engine_id`, of every engine (in
    its current epoch) in arrival order."""
    stmt = select(EventBatch).where(EventBatch.seq > after_seq)
    if engine_id is not None:
        engine = session.get(Engine, engine_id)
        if engine is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"engine {engine_id!r} not found")
        epoch = engine.epoch if epoch is None else epoch
        stmt = stmt.where(EventBatch.engine_id == engine_id, EventBatch.epoch == epoch)
        stmt = stmt.order_by(EventBatch.seq)
    elif epoch is not None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "epoch needs an engine_id")
    else:
        stmt = stmt.join(
            Engine, (Engine.engine_id == EventBatch.engine_id) & (Engine.epoch == EventBatch.epoch)
        ).order_by(EventBatch.id)
    batches = [BatchOut.model_validate(row) for row in session.scalars(stmt.limit(limit))]
    return EventPage(
        engine_id=engine_id,
        epoch=epoch,
        after_seq=after_seq,
        limit=limit,
        next_after_seq=batches[-1].seq if batches else after_seq,
        batches=batches,
    )
