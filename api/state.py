"""What the app holds for its routes: settings, the database, connected engines, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.db import make_engine, make_sessionmaker
from api.metrics import ApiMetrics
from api.registry import EngineRegistry
from api.settings import Settings


@dataclass
class AppState:
    settings: Settings
    db: Engine
    sessions: sessionmaker[Session]
    registry: EngineRegistry = field(default_factory=EngineRegistry)
    metrics: ApiMetrics = field(default_factory=ApiMetrics)

    @classmethod
    def from_settings(cls, settings: Settings) -> AppState:
        db = make_engine(settings.database_url)
        return cls(settings=settings, db=db, sessions=make_sessionmaker(db))
