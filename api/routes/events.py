"""The event batches as they came, for readers that follow an engine's stream."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from api.deps import MAX_INT64, READ, SessionDep
from api.openapi import error
from api.schemas import BatchOut, EventPage
from api.store import batches, engines

router = APIRouter(prefix="/events", tags=["events"], dependencies=[READ])


@router.get(
    "",
    response_model=EventPage,
    responses={
        400: error("`epoch` without `engine_id`"),
        404: error("no engine of that `engine_id`"),
    },
)
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
    its current epoch) in arrival order. A finished request's `junction_token_ids` (prompt
    tokens) are left out: `GET /junctions/suggested` gives them where they are needed; so are
    the unit hashes of requests and pins (the store keeps none: `api.ingest.frames`)."""
    if engine_id is not None:
        engine = engines.find_engine(session, engine_id)
        if engine is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"engine {engine_id!r} not found")
        epoch = engine.epoch if epoch is None else epoch
        rows = batches.engine_batches(session, engine_id, epoch, after_seq, limit)
    elif epoch is not None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "epoch needs an engine_id")
    else:
        rows = batches.current_batches(session, after_seq, limit)
    out = [BatchOut.model_validate(row) for row in rows]
    for batch in out:
        for event in batch.events:  # the prompt's tokens only where needed: not in the log
            if event.get("type") == "RequestFinished":
                event.pop("junction_token_ids", None)
            if event.get("type") in ("RequestFinished", "PinUpdated"):
                event.pop("unit_hashes", None)
    return EventPage(
        engine_id=engine_id,
        epoch=epoch,
        after_seq=after_seq,
        limit=limit,
        next_after_seq=out[-1].seq if out else after_seq,
        batches=out,
    )
