"""What the app holds for its routes: settings, the database, the replica it is and the
engines connected to it, metrics, and its background tasks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import IO

import anyio
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.fleet.registry import EngineRegistry
from api.fleet.replicas import new_replica_id
from api.ingest.snapshot_chunks import SnapshotBudget
from api.metrics import ApiMetrics
from api.settings import Settings
from api.store.db import DatabaseTimeouts, make_engine, make_sessionmaker
from api.store.health import HealthCheck

# Worker threads the ingest socket's decoding and commits may take at once: its own, apart from
# the pool the REST routes share, so reads cannot keep it waiting for a thread
# (`api.guards.read_limit`).
INGEST_THREADS = 16


@dataclass
class AppState:
    settings: Settings
    db: Engine
    sessions: sessionmaker[Session]
    registry: EngineRegistry = field(default_factory=EngineRegistry)
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    ingest_threads: anyio.CapacityLimiter = field(
        default_factory=lambda: anyio.CapacityLimiter(INGEST_THREADS)
    )
    health: HealthCheck = field(default_factory=HealthCheck)  # `/healthz`'s, off the readers' path
    # this process in the fleet (`api.fleet.replicas`, `api.membership`)
    replica_id: str = field(default_factory=new_replica_id)
    sqlite_lock: IO[str] | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    # what every connection's unfinished chunked snapshots hold (`api.ingest.snapshot_chunks`)
    snapshot_budget: SnapshotBudget | None = None

    def __post_init__(self) -> None:
        if self.snapshot_budget is None:
            self.snapshot_budget = SnapshotBudget(self.settings.max_snapshot_bytes_total)

    @classmethod
    def from_settings(cls, settings: Settings) -> AppState:
        db = make_engine(
            settings.database_url,
            DatabaseTimeouts(settings.db_connect_timeout_s, settings.db_statement_timeout_s),
        )
        return cls(settings=settings, db=db, sessions=make_sessionmaker(db))
