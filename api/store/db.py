"""The database engine and session factory, built from the settings' URL."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL (readers do not block the writer), foreign keys
    (off by default there) and a busy timeout, since the ingest socket and REST share it.

    PostgreSQL plans every statement for its own parameters (`plan_cache_mode`): psycopg
    prepares a statement run five times, and the generic plan PostgreSQL then picks for
    `shared_units.prune`'s "last seen before $1" guesses a third of the engine's units match
    and scans them all, 6 ms a frame where the custom plan's index scan takes 0.7."""
    if not url.startswith("sqlite"):
        engine = create_engine(url, pool_pre_ping=True)
        if engine.dialect.name == "postgresql":
            event.listen(engine, "connect", _custom_plans)
        return engine
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def _custom_plans(dbapi_connection, _record) -> None:
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True  # a SET outside any transaction: it lasts
    try:
        dbapi_connection.execute("SET plan_cache_mode = force_custom_plan")
    finally:
        dbapi_connection.autocommit = autocommit


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
