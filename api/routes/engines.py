"""Engines: what each last said in its hello, and its cache usage from the stored rows."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from sqlalchemy.orm import Session

from api.deps import READ, EngineDep, RequireWrite, SessionDep, StateDep
from api.openapi import ENGINE_NOT_FOUND, WRITE_ERRORS, error
from api.peers import reads as peer_reads
from api.schemas import EngineDetail, EngineOut, GroupUsage
from api.store import engines
from api.store.models import Engine

router = APIRouter(prefix="/engines", tags=["engines"], dependencies=[READ])


@router.get("", response_model=list[EngineOut])
def list_engines(session: SessionDep) -> list[Engine]:
    return engines.list_engines(session)


@router.get("/{engine_id}", response_model=EngineDetail, responses=ENGINE_NOT_FOUND)
def get_engine(engine: EngineDep, session: SessionDep) -> EngineDetail:
    """The engine, its cache by group, and how many requests the store holds. An engine
    without physical block ids counts its `peer-blocks` per group (all cached, none free; the
    usage is the mean of its ranks' last reported one, 0 when none was)."""
    if engine.geometry.is_peer:
        cache = _peer_usage(session, engine.engine_id)
    else:
        cache = {
            group: _usage(states, engine.geometry.group_num_blocks(group))
            for group, states in engines.block_counts(session, engine.engine_id).items()
        }
    return EngineDetail(
        **EngineOut.model_validate(engine).model_dump(),
        cache=cache,
        num_requests=engines.num_requests(session, engine.engine_id),
    )


@router.delete(
    "/{engine_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=ENGINE_NOT_FOUND | WRITE_ERRORS | {409: error("the engine is connected")},
)
def delete_engine(_: RequireWrite, engine: EngineDep, session: SessionDep, state: StateDep) -> None:
    """Forget an engine that is gone: its rows, batches, requests, buckets and its side of
    every pin (the pins stay, for their other engines)."""
    if engine.connected:  # to any replica
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"engine {engine.engine_id!r} is connected; stop it first"
        )
    engines.forget_engine(session, engine)
    session.commit()


def _peer_usage(session: Session, engine_id: str) -> dict[str, GroupUsage]:
    usage = peer_reads.latest_usage(session, engine_id) or 0.0
    return {
        group: GroupUsage(
            num_blocks=count,
            num_free=0,
            num_cached=count,
            num_in_use=0,
            num_pinned=0,
            usage=usage,
        )
        for group, count in peer_reads.group_counts(session, engine_id).items()
    }


def _usage(states: dict[str, int], num_blocks: int | None) -> GroupUsage:
    num_held = states["cached"] + states["in_use"] + states["pinned"]
    if num_blocks is None or num_blocks < num_held + states["free"]:
        num_blocks = num_held + states["free"]
    return GroupUsage(
        num_blocks=num_blocks,
        num_free=num_blocks - num_held,
        num_cached=states["cached"],
        num_in_use=states["in_use"],
        num_pinned=states["pinned"],
        usage=(states["in_use"] + states["pinned"]) / num_blocks if num_blocks else 0.0,
    )
