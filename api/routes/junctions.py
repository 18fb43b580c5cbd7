"""Suggested junctions: boundaries many recorded requests share and no checkpoint covers
(`api.attribution.junctions` says how they are found)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from api.attribution import junctions
from api.deps import READ, SessionDep
from api.openapi import error
from api.schemas import JunctionOut, JunctionPage, JunctionPinRequest
from api.store import engines

router = APIRouter(prefix="/junctions", tags=["junctions"], dependencies=[READ])


@router.get(
    "/suggested",
    response_model=JunctionPage,
    responses={404: error("no engine of that `engine_id`")},
)
def suggested_junctions(
    session: SessionDep,
    engine_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    # the boundary is compared as the store's 32-bit integer: a larger one would fail there
    min_tokens: Annotated[int, Query(ge=0, le=2**31 - 1)] = junctions.MIN_BOUNDARY,
) -> JunctionPage:
    """The junctions worth a pin, most tokens saved first (then most requests); each with the
    `POST /pins` body that pins it. `engine_id` counts only that engine's requests;
    `min_tokens` leaves out boundaries shorter than that (a chat header's first words)."""
    if engine_id is not None and engines.find_engine(session, engine_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"engine {engine_id!r} not found")
    found = junctions.suggested_junctions(session, engine_id, limit, min_tokens)
    return JunctionPage(
        engine_id=engine_id, limit=limit, junctions=[junction_out(j) for j in found]
    )


def junction_out(junction: junctions.Junction) -> JunctionOut:
    return JunctionOut(
        key=junction.key,
        boundary=junction.boundary,
        num_requests=junction.num_requests,
        num_short_requests=junction.num_short_requests,
        tokens_saved=junction.tokens_saved,
        engine_ids=junction.engine_ids,
        pin_request=JunctionPinRequest(
            prefix={"token_ids": junction.token_ids}, label=f"junction@{junction.boundary}"
        ),
    )
