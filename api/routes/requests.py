"""Finished requests of an engine, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from api.deps import READ, EngineDep, Offset, SessionDep
from api.openapi import ENGINE_NOT_FOUND, error
from api.schemas import RequestOut, RequestPage
from api.store import requests

router = APIRouter(
    prefix="/engines/{engine_id}/requests",
    tags=["requests"],
    dependencies=[READ],
    responses=ENGINE_NOT_FOUND,
)


@router.get("", response_model=RequestPage)
def list_requests(
    engine: EngineDep,
    session: SessionDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> RequestPage:
    total, rows = requests.request_page(session, engine.engine_id, offset, limit)
    return RequestPage(
        engine_id=engine.engine_id,
        total=total,
        offset=offset,
        limit=limit,
        requests=requests.request_outs(session, engine.engine_id, rows),
    )


@router.get(
    "/{request_id}",
    response_model=RequestOut,
    responses={404: error("no engine of that id, or no request of that id on it")},
)
def get_request(engine: EngineDep, session: SessionDep, request_id: str) -> RequestOut:
    """The request's latest record (an id may come back in a later epoch), with its
    attribution."""
    row = requests.latest_request(session, engine.engine_id, request_id)
    if row is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"request {request_id!r} of engine {engine.engine_id!r} not found",
        )
    return requests.request_outs(session, engine.engine_id, [row])[0]
