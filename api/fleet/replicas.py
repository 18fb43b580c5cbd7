"""Replicas: any number of `junction api` processes on one PostgreSQL database, behind a load
balancer that passes websockets through (`stack/balancer.py`, compose's `lb`).

Each process is a replica with a row in `replicas` (`Replica`), its heartbeat refreshed every
`JUNCTION_REPLICA_HEARTBEAT_S`. An engine may connect to any of them: its hello records, in
the engine's row, the replica that holds the socket (`replica_id`) and the socket itself
(`connection_id`), so "connected" is true fleet-wide:

- Every beat, each replica marks disconnected the engines held by a replica whose heartbeat
  is older than `JUNCTION_REPLICA_TIMEOUT_S` (one killed with -9 says no goodbye), and
  forgets those replicas: a dead replica's engines show as disconnected within a timeout and
  a beat, and as connected again once they have reconnected, through the balancer, elsewhere.
  A replica that finds its own row gone (it stalled past the timeout) writes it again and
  marks its sockets' engines connected again.
- The newest hello wins wherever the older socket is: the hello's claim (`claim_engine`)
  notifies every replica (`TAKEOVER`), and the one holding an older socket of that engine
  closes it (`CLOSE_SUPERSEDED`). A socket's goodbye (`release_engine`) only clears the
  engine's flag while the row still names that socket.
- Commands (pin, unpin) written by any replica reach the engine through the replica that
  holds its socket: the route writes a `NOTIFY` per engine (`COMMANDS`, delivered at the
  route's commit; its payload names the engine, the pin and the command, never the pin's
  tokens, which may be megabytes), and the listener (`listen`) of the replica holding the
  engine's socket then loads the pin and sends the command. Nothing is lost while an engine
  reconnects, or while a listener is away: the pins are in the database, an engine is sent
  the ones it is owed after its hello (`api.fleet.pins.hello_commands`), and each of a replica's
  engines again when its listener has reconnected.

SQLite is the single-process embedded default: `claim_sqlite` takes an exclusive lock on a
file beside the database for the life of the process, and a second `junction api` on the same
file is refused (`SingleProcessStore`) with what to do instead. There is no NOTIFY there, and
no need: every engine is connected to the one process.

Heartbeats and their timeout are compared on the replicas' own clocks (UTC): replicas on
several machines need them in step (NTP), well within `JUNCTION_REPLICA_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO

from sqlalchemy import delete, or_, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from api.store.models import Engine, Replica, utcnow

log = logging.getLogger(__name__)

COMMANDS = "junction_commands"  # {"engine_id", "pin_id", "command": "pin" | "unpin"}
TAKEOVER = "junction_takeover"  # {"engine_id", "connection_id"}: the socket that won
MAX_NOTIFY_BYTES = 7900  # PostgreSQL refuses a payload of 8000 bytes or more
LISTEN_RETRY_S = (0.5, 1.0, 2.0, 5.0)  # a lost listener connection: the waits between tries


class SingleProcessStore(RuntimeError):
    """A second `junction api` on a SQLite store that one process already serves."""


def new_replica_id() -> str:
    """`host-pid-random`: readable in `GET /engines`, and unique across restarts."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"


def new_connection_id() -> str:
    return secrets.token_hex(8)


def is_postgres(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (`postgresql+psycopg://`) as psycopg itself takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def committed(session: Session) -> Iterator[None]:
    """Commit what the block did (in the session's transaction, begun by it or before), or
    roll back and raise."""
    try:
        yield
        session.commit()
    except BaseException:
        session.rollback()
        raise


# ---------------------------------------------------------------------------- SQLite
def claim_sqlite(url: str) -> IO[str] | None:
    """For a SQLite file store, an exclusive lock on `<database>-replica.lock`, held until
    `release_sqlite` (or the process's end: the kernel drops it with the process, a kill -9
    included); None for another database or an in-memory one. Claims in one process share
    the lock (`junction api` claims before migrating, its app again when it starts). Raises
    `SingleProcessStore` when another process holds it."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(f"{parsed.database}-replica.lock").resolve()
    if path in _HELD:
        lock, claims = _HELD[path]
        _HELD[path] = (lock, claims + 1)
        return lock
    lock = path.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise SingleProcessStore(
            f"the SQLite store {parsed.database} is served by another junction api ({holder});"
            " SQLite takes one process only: stop that one, or run replicas on PostgreSQL"
            " (JUNCTION_DATABASE_URL=postgresql://...)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    _HELD[path] = (lock, 1)
    return lock


def release_sqlite(lock: IO[str]) -> None:
    """Give back a claim of `claim_sqlite`; the last one unlocks the file."""
    path = Path(lock.name).resolve()
    held, claims = _HELD.get(path, (lock, 1))
    if claims > 1:
        _HELD[path] = (held, claims - 1)
        return
    _HELD.pop(path, None)
    held.close()


_HELD: dict[Path, tuple[IO[str], int]] = {}  # this process's SQLite locks, and their claims


# ---------------------------------------------------------------------------- presence
def join(session: Session, replica_id: str, timeout_s: float, is_only: bool) -> None:
    """Write the replica's row and reap the dead ones, in one transaction. `is_only` (SQLite,
    whose lock says no other process is alive): every other row is dead, whatever its age."""
    now = utcnow()
    with committed(session):
        if is_only:
            session.execute(delete(Replica))
            session.execute(update(Engine).values(connected=False))
        session.add(_this_process(replica_id, now))
        session.flush()
        reap(session, now, timeout_s)


def beat(session: Session, replica_id: str, timeout_s: float, connection_ids: Iterable[str]) -> int:
    """Refresh the replica's heartbeat and reap the dead, in one transaction; a replica whose
    row was reaped (it stalled) writes it again and reclaims its sockets' engines. Returns
    the engines it found held by dead replicas (now disconnected). An engine the row says
    this replica holds by a socket it does not hold is disconnected."""
    now, ids = utcnow(), list(connection_ids)
    with committed(session):
        found = session.execute(
            update(Replica).where(Replica.replica_id == replica_id).values(heartbeat_at=now)
        ).rowcount
        if not found:
            log.warning("replica %s was taken for dead (a stall?): rejoining", replica_id)
            session.add(_this_process(replica_id, now))
            session.flush()
            if ids:
                session.execute(
                    update(Engine)
                    .where(Engine.connection_id.in_(ids))
                    .values(connected=True, replica_id=replica_id)
                )
        # a goodbye that could not be written (the store was away): its engine is free again
        session.execute(
            update(Engine)
            .where(
                Engine.replica_id == replica_id,
                Engine.connected.is_(True),
                or_(Engine.connection_id.is_(None), Engine.connection_id.not_in(ids)),
            )
            .values(connected=False, replica_id=None, last_seen=now)
            .execution_options(synchronize_session=False)
        )
        return reap(session, now, timeout_s)


def reap(session: Session, now: datetime, timeout_s: float) -> int:
    """Disconnect the engines of replicas silent for `timeout_s` (or of none), and forget
    those replicas; returns how many engines it disconnected. The caller commits."""
    cutoff = now - timedelta(seconds=timeout_s)
    alive = select(Replica.replica_id).where(Replica.heartbeat_at >= cutoff)
    orphaned = session.execute(
        update(Engine)
        .where(
            Engine.connected.is_(True),
            or_(Engine.replica_id.is_(None), Engine.replica_id.not_in(alive)),
        )
        # its connection_id: for a rejoin (`beat`); seen now, so the lease (api.ingest.lease)
        # gives the engine its time to reconnect elsewhere
        .values(connected=False, replica_id=None, last_seen=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.execute(delete(Replica).where(Replica.heartbeat_at < cutoff))
    if orphaned:
        log.warning("%d engine(s) of a replica gone silent marked disconnected", orphaned)
    return orphaned


def leave(session: Session, replica_id: str) -> None:
    """A replica stopping: its engines are disconnected and its row goes."""
    with committed(session):
        session.execute(
            update(Engine)
            .where(Engine.replica_id == replica_id)
            .values(connected=False, replica_id=None, connection_id=None, last_seen=utcnow())
        )
        session.execute(delete(Replica).where(Replica.replica_id == replica_id))


def _this_process(replica_id: str, now: datetime) -> Replica:
    hostname, pid = socket.gethostname(), os.getpid()
    return Replica(
        replica_id=replica_id, hostname=hostname, pid=pid, started_at=now, heartbeat_at=now
    )


def live_replicas(session: Session, timeout_s: float) -> list[Replica]:
    cutoff = utcnow() - timedelta(seconds=timeout_s)
    stmt = select(Replica).where(Replica.heartbeat_at >= cutoff).order_by(Replica.started_at)
    return list(session.scalars(stmt))


# ---------------------------------------------------------------------------- sockets
def claim_engine(
    session: Session, engine_id: str, epoch: int, replica_id: str, connection_id: str
) -> None:
    """Record that `replica_id` holds the engine's newest socket, `connection_id`, and (on
    PostgreSQL) tell every replica, so one holding an older socket of it closes that one."""
    with committed(session):
        session.execute(
            update(Engine)
            .where(Engine.engine_id == engine_id, Engine.epoch == epoch)
            .values(connected=True, replica_id=replica_id, connection_id=connection_id)
        )
        notify(session, TAKEOVER, {"engine_id": engine_id, "connection_id": connection_id})


def release_engine(
    session: Session, engine_id: str, connection_id: str, end_lease: bool = False
) -> bool:
    """A socket's goodbye: the engine is disconnected unless a newer socket of it (here or on
    another replica) took its place meanwhile; True when it was. `end_lease`: the engine said
    it stops, so no process holds its id any more (`api.ingest.lease`)."""
    values = {"connected": False, "replica_id": None, "connection_id": None, "last_seen": utcnow()}
    if end_lease:
        values["instance_id"] = ""
    with committed(session):
        return bool(
            session.execute(
                update(Engine)
                .where(Engine.engine_id == engine_id, Engine.connection_id == connection_id)
                .values(**values)
            ).rowcount
        )


def notify_commands(
    session: Session,
    engine_ids: Iterable[str],
    pin_id: str,
    command: str,
    sent_by: str | None = None,
    sent_to: Mapping[str, str] | None = None,
) -> int:
    """Queue a `NOTIFY` per engine for the replica that holds it, in the caller's transaction
    (delivered at its commit, dropped at a rollback); returns how many. No-op on SQLite.
    `sent_to` names the socket (`connection_id`) replica `sent_by` sends the command to itself,
    for the engines it holds."""
    num = 0
    for engine_id in engine_ids:
        payload = {"engine_id": engine_id, "pin_id": pin_id, "command": command}
        if sent_to and engine_id in sent_to:
            payload |= {"sent_by": sent_by, "connection_id": sent_to[engine_id]}
        num += notify(session, COMMANDS, payload)
    return num


def notify(session: Session, channel: str, payload: dict) -> bool:
    """`pg_notify(channel, payload)` in the caller's transaction; False on SQLite."""
    if session.get_bind().dialect.name != "postgresql":
        return False
    data = json.dumps(payload, separators=(",", ":"))
    if len(data.encode()) > MAX_NOTIFY_BYTES:  # engine and pin ids are short: never, in practice
        raise ValueError(f"a {channel} notification of {len(data)} bytes is too big")
    session.execute(
        text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": data}
    )
    return True


async def listen(
    url: str,
    on_notify: Callable[[str, dict], Awaitable[None]],
    on_reconnect: Callable[[], Awaitable[None]],
    listening: asyncio.Event,
) -> None:
    """Forever (until cancelled): `LISTEN` on `COMMANDS` and `TAKEOVER` over a connection of
    its own, awaiting `on_notify(channel, payload)` for each notification in order; sets
    `listening` once the first `LISTEN` is in place. A lost connection is retried with
    backoff; once back, `on_reconnect()` runs (the notifications sent meanwhile are gone: it
    resends what the replica's engines are owed)."""
    import psycopg  # PostgreSQL only: the driver is not needed on SQLite

    failures = 0
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                libpq_url(url), autocommit=True
            ) as connection:
                await connection.execute(f"LISTEN {COMMANDS}")
                await connection.execute(f"LISTEN {TAKEOVER}")
                listening.set()
                if failures:
                    log.info("replica listener reconnected after %d failure(s)", failures)
                    failures = 0
                    await on_reconnect()
                async for notification in connection.notifies():
                    try:
                        payload = json.loads(notification.payload)
                        await on_notify(notification.channel, payload)
                    except Exception:
                        log.exception("replica listener: could not handle %s", notification)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            wait = LISTEN_RETRY_S[min(failures, len(LISTEN_RETRY_S) - 1)]
            failures += 1
            log.warning("replica listener lost its connection (%s); retrying in %.1f s", exc, wait)
            await asyncio.sleep(wait)
