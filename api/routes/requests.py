"""Finished requests of an engine, newest first, each with its miss attribution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from api.deps import READ, EngineDep, Offset, SessionDep
from api.openapi import ENGINE_NOT_FOUND, error
from api.schemas import MatchStopOut, RequestAttribution, RequestOut, RequestPage
from api.store import requests
from api.store.models import Attribution, Request
from engine.events import DEVICE
from workloads.misses import REASONS

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
        requests=request_outs(session, engine.engine_id, rows),
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
    return request_outs(session, engine.engine_id, [row])[0]


def request_outs(session: Session, engine_id: str, rows: Sequence[Request]) -> list[RequestOut]:
    """The rows as the REST API serves them, each with its `attribution` (two reads for all)."""
    done, pending = requests.attributions(session, engine_id, rows)
    outs = []
    for row in rows:
        out = RequestOut.model_validate(row)
        if out.hit_tokens_by_tier is None:  # nothing loaded: the device served the hit
            out.hit_tokens_by_tier = {DEVICE: row.num_cached_tokens}
            out.loaded_bytes_by_tier = {}
        key = (row.epoch, row.arrival_index)
        if out.match_stop is not None and (key in done or key in pending):
            out.attribution = _attribution(done.get(key), out.match_stop)
        outs.append(out)
    return outs


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
