"""Engines in the store: the rows their hellos keep, their blocks counted by state, and
forgetting one that is gone. Nothing here commits: the caller's transaction does."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from api.store.models import (
    Block,
    DeadLetter,
    Engine,
    EventBatch,
    HitRateBucket,
    PeerBlock,
    PeerChurnBucket,
    PeerMetricSample,
    PeerResyncRecord,
    Request,
)
from engine.wire import BLOCK_STATES, GROUPS


def list_engines(session: Session) -> list[Engine]:
    """Every engine the store has seen, by id."""
    return list(session.scalars(select(Engine).order_by(Engine.engine_id)))


def find_engine(session: Session, engine_id: str) -> Engine | None:
    """The engine of that id, or None when the store has never seen it."""
    return session.get(Engine, engine_id)


def block_counts(session: Session, engine_id: str) -> dict[str, dict[str, int]]:
    """The engine's stored block rows counted by group, then state; every group of
    `engine.wire.GROUPS` and every state of `BLOCK_STATES` is there, 0 when it has no row."""
    counts = session.execute(
        select(Block.group, Block.state, func.count())
        .where(Block.engine_id == engine_id)
        .group_by(Block.group, Block.state)
    ).all()
    by_group = {group: dict.fromkeys(BLOCK_STATES, 0) for group in GROUPS}
    for group, state, count in counts:
        by_group.setdefault(group, dict.fromkeys(BLOCK_STATES, 0))[state] = count
    return by_group


def num_requests(session: Session, engine_id: str) -> int:
    """How many finished requests of the engine the store holds."""
    stmt = select(func.count()).select_from(Request).where(Request.engine_id == engine_id)
    return session.scalar(stmt) or 0


def forget_engine(session: Session, engine: Engine) -> None:
    """Delete the engine with its rows, batches, requests, buckets, dead letters, its peer
    tables and its side of every pin (the pins stay, for their other engines)."""
    peer_tables = (PeerBlock, PeerChurnBucket, PeerMetricSample, PeerResyncRecord)
    for table in (Block, EventBatch, Request, HitRateBucket, DeadLetter, *peer_tables):
        session.execute(delete(table).where(table.engine_id == engine.engine_id))
    session.delete(engine)
