"""The frames the store refused from an engine (its dead letters), newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import READ, EngineDep, Offset, SessionDep
from api.ingest import dead_letters
from api.openapi import ENGINE_NOT_FOUND
from api.schemas import DeadLetterOut, DeadLetterPage

router = APIRouter(
    prefix="/engines/{engine_id}/dead-letters",
    tags=["dead-letters"],
    dependencies=[READ],
    responses=ENGINE_NOT_FOUND,
)


@router.get("", response_model=DeadLetterPage)
def list_dead_letters(
    engine: EngineDep,
    session: SessionDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DeadLetterPage:
    """Frames that decoded but that the store could not apply (a constraint, a value beyond
    its column, a database limit): each was kept here with the reason and acknowledged, so
    the engine's stream went on without it. At most `JUNCTION_DEAD_LETTERS_PER_ENGINE` are
    kept per engine, the oldest dropped first."""
    total, rows = dead_letters.dead_letter_page(session, engine.engine_id, offset, limit)
    return DeadLetterPage(
        engine_id=engine.engine_id,
        total=total,
        offset=offset,
        limit=limit,
        dead_letters=[DeadLetterOut.model_validate(row) for row in rows],
    )
