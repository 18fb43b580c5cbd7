"""The replicas of the control plane (`api.fleet.replicas`): the `junction api` processes on this
store whose heartbeats are fresh, with the engines each holds."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import func, select

from api.deps import READ, SessionDep, StateDep
from api.fleet import replicas
from api.schemas import ReplicaOut
from api.store.models import Engine

router = APIRouter(prefix="/replicas", tags=["replicas"], dependencies=[READ])


@router.get("", response_model=list[ReplicaOut])
def list_replicas(session: SessionDep, state: StateDep) -> list[ReplicaOut]:
    """The live replicas, oldest first; `is_self` marks the one that answered. A replica
    silent for `JUNCTION_REPLICA_TIMEOUT_S` is not listed: it is dead, its engines
    disconnected."""
    held = dict(
        session.execute(
            select(Engine.replica_id, func.count())
            .where(Engine.connected.is_(True))
            .group_by(Engine.replica_id)
        ).all()
    )
    return [
        ReplicaOut(
            replica_id=row.replica_id,
            hostname=row.hostname,
            pid=row.pid,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            num_engines=held.get(row.replica_id, 0),
            is_self=row.replica_id == state.replica_id,
        )
        for row in replicas.live_replicas(session, state.settings.replica_timeout_s)
    ]
