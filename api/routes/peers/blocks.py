"""Engines without physical block ids (vLLM, SGLang through `junction attach`): their cache as
the store keeps it, hash-keyed, and a summary of it (`api.peers.reads`)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import READ, EngineDep, Offset, SessionDep
from api.openapi import ENGINE_NOT_FOUND
from api.peers import reads as peer_reads
from api.schemas import PeerBlockOut, PeerBlockPage, PeerSummary
from api.store.models import PeerBlock
from engine.events import INT32_MAX, tier_of_medium

router = APIRouter(
    prefix="/engines/{engine_id}", tags=["peers"], dependencies=[READ], responses=ENGINE_NOT_FOUND
)
MAX_LIMIT = 10_000
MAX_WINDOW_S = 366 * 86400.0


@router.get("/peer-blocks", response_model=PeerBlockPage)
def list_peer_blocks(
    engine: EngineDep,
    session: SessionDep,
    rank: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
    group: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    medium: Annotated[str | None, Query(min_length=1, max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 1000,
    offset: Offset = 0,
) -> PeerBlockPage:
    """Blocks ordered by rank, group, medium, then hash; `rank`, `group` and `medium` filter
    them. An engine with physical block ids has none (its table is `/blocks`)."""
    if not engine.geometry.is_peer:
        return PeerBlockPage(total=0, blocks=[])
    total, rows = peer_reads.block_page(
        session, engine.engine_id, rank, group, medium, offset, limit
    )
    return PeerBlockPage(total=total, blocks=[peer_block_out(row) for row in rows])


@router.get("/peer-summary", response_model=PeerSummary)
def peer_summary(
    engine: EngineDep,
    session: SessionDep,
    window_s: Annotated[float, Query(gt=0, le=MAX_WINDOW_S)] = 3600.0,
) -> dict:
    """Blocks by group and medium, ranks, and the last `window_s` seconds of churn, metric
    samples, hit rate and resyncs; `kind` "junction" for an engine with physical block ids."""
    return peer_reads.summary(session, engine, time.time() - window_s)


def peer_block_out(row: PeerBlock) -> PeerBlockOut:
    return PeerBlockOut(
        rank=row.rank,
        group=row.group,
        group_idx=row.group_idx,
        medium=row.medium,
        tier=tier_of_medium(row.medium) or row.medium,
        hash=row.block_hash,
        parent=row.parent_hash,
        num_tokens=row.num_tokens,
        token_sample=row.token_sample,
        stored_at=row.stored_at,
    )
