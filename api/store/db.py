"""The database engine and session factory, built from the settings' URL.

**A partition must not hang the API.** When the network to PostgreSQL stops answering but
keeps the connections open (a frozen proxy or load balancer, a host that acknowledges and drops),
libpq waits for an answer for good: the TCP keepalives are answered, nothing is lost in flight,
so neither keepalives nor `tcp_user_timeout` ever fire, and every request that touches the store
hung past 40 s (issue 31). So each PostgreSQL connection is a `TimedConnection`: psycopg's own,
waiting at most `statement_s` for the answer to anything it sends (a statement, a commit, the
pool's ping); past that it closes its socket and raises `OperationalError`, which the pool takes
for a disconnect (the connection is dropped) and the API answers with 503. Connecting is bound
by libpq's `connect_timeout`, and TCP keepalives and `tcp_user_timeout` notice a peer that is
gone (a dropping partition) sooner. The server's own `statement_timeout` is left alone: a
migration or a large snapshot may run long on a healthy server, and the client-side bound only
has to catch a server that does not answer.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import psycopg
from psycopg import errors as pg_errors
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


class DatabaseTimeouts(NamedTuple):
    """`JUNCTION_DB_CONNECT_TIMEOUT_S` and `JUNCTION_DB_STATEMENT_TIMEOUT_S` (PostgreSQL)."""

    connect_s: float = 5.0
    statement_s: float = 30.0


DEFAULT_TIMEOUTS = DatabaseTimeouts()


class TimedConnection(psycopg.Connection):
    """psycopg's connection, giving up on an answer after `answer_timeout_s` seconds."""

    answer_timeout_s: float = DEFAULT_TIMEOUTS.statement_s

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        try:
            bound = self.answer_timeout_s if timeout is None else timeout
            return super().wait(gen, interval, bound)
        except pg_errors._WaitTimeout:  # psycopg's own "no answer in time", pinned (3.3)
            self.pgconn.finish()  # mid-protocol, the connection cannot be used again
            raise psycopg.OperationalError(
                f"the database did not answer in {self.answer_timeout_s:g} s: it may be "
                f"unreachable, or the statement runs longer than JUNCTION_DB_STATEMENT_TIMEOUT_S "
                f"allows"
            ) from None


def make_engine(url: str, timeouts: DatabaseTimeouts | None = DEFAULT_TIMEOUTS) -> Engine:
    """An engine for `url`; SQLite gets WAL (readers do not block the writer), foreign keys
    (off by default there) and a busy timeout, since the ingest socket and REST share it.

    PostgreSQL gets `timeouts` (None: libpq's defaults, no bound; for migrations, whose
    statements may run long) and plans every statement for its own parameters
    (`plan_cache_mode`): psycopg prepares a statement run five times, and the generic plan
    PostgreSQL then picks for `shared_units.prune`'s "last seen before $1" guesses a third of
    the engine's units match and scans them all, 6 ms a frame where the custom plan's index
    scan takes 0.7."""
    if not url.startswith("sqlite"):
        is_postgres = url.startswith("postgresql")
        options: dict[str, Any] = {"pool_pre_ping": True}
        if is_postgres and timeouts is not None:
            options["pool_timeout"] = timeouts.statement_s
            options["connect_args"] = _libpq_timeouts(timeouts)
        engine = create_engine(url, **options)
        if engine.dialect.name == "postgresql":
            event.listen(engine, "connect", _custom_plans)
            if timeouts is not None:
                event.listen(engine, "do_connect", _timed_connect(timeouts.statement_s))
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


def _libpq_timeouts(timeouts: DatabaseTimeouts) -> dict[str, int]:
    """libpq's connection parameters: its connect timeout (whole seconds, at least 2, as libpq
    reads it), TCP keepalives every few seconds, and unacknowledged data given up with the
    statement bound."""
    return {
        "connect_timeout": max(2, math.ceil(timeouts.connect_s)),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": math.ceil(timeouts.statement_s * 1000),
    }


def _timed_connect(statement_s: float):
    """SQLAlchemy's `do_connect` hook: connect a `TimedConnection` bound to `statement_s`."""

    def connect(_dialect, _record, cargs, cparams) -> TimedConnection:
        connection = TimedConnection.connect(*cargs, **cparams)
        connection.answer_timeout_s = statement_s
        return connection

    return connect


def _custom_plans(dbapi_connection, _record) -> None:
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True  # a SET outside any transaction: it lasts
    try:
        dbapi_connection.execute("SET plan_cache_mode = force_custom_plan")
    finally:
        dbapi_connection.autocommit = autocommit


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
