"""Replicas in the store (`api.fleet.replicas`), on both backends: heartbeats, the reaping of a
silent replica's engines, the newest socket winning a goodbye, the SQLite lock that keeps a
second process out, and on PostgreSQL the LISTEN/NOTIFY listener that carries commands and
takeovers between replicas, over a real connection that is cut and comes back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from api.fleet import replicas
from api.store.db import make_engine, make_sessionmaker
from api.store.models import Engine, Replica, utcnow
from tests.api.conftest import Postgres
from tests.api.processes import ApiProcess, free_port

TIMEOUT_S = 5.0


def add_engines(session: Session, *engine_ids: str) -> None:
    with session.begin():
        for engine_id in engine_ids:
            session.add(Engine(engine_id=engine_id, epoch=1, next_seq=0))


def engine_row(session: Session, engine_id: str) -> tuple[bool, str | None, str | None]:
    session.expire_all()
    engine = session.get(Engine, engine_id)
    return engine.connected, engine.replica_id, engine.connection_id


def replica_ids(session: Session) -> set[str]:
    session.expire_all()
    return {r.replica_id for r in session.query(Replica)}


def silence(session: Session, replica_id: str, seconds: float) -> None:
    """Age the replica's heartbeat by `seconds`, as if it had stopped beating."""
    with session.begin():
        session.execute(
            update(Replica)
            .where(Replica.replica_id == replica_id)
            .values(heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )


def test_a_silent_replicas_engines_are_disconnected_and_it_rejoins(session: Session) -> None:
    add_engines(session, "e1", "e2", "e3")
    replicas.join(session, "a", TIMEOUT_S, is_only=False)
    replicas.join(session, "b", TIMEOUT_S, is_only=False)
    replicas.claim_engine(session, "e1", 1, "a", "c1")
    replicas.claim_engine(session, "e2", 1, "b", "c2")
    assert engine_row(session, "e1") == (True, "a", "c1")
    assert replicas.beat(session, "b", TIMEOUT_S, ["c2"]) == 0  # a is alive: nothing reaped

    silence(session, "a", TIMEOUT_S - 1)
    assert replicas.beat(session, "b", TIMEOUT_S, ["c2"]) == 0  # late, not dead
    silence(session, "a", TIMEOUT_S + 1)
    assert replicas.beat(session, "b", TIMEOUT_S, ["c2"]) == 1
    assert engine_row(session, "e1") == (False, None, "c1")
    assert engine_row(session, "e2") == (True, "b", "c2")
    assert replica_ids(session) == {"b"}

    # a was only stalled: its next beat writes its row again and reclaims its socket's engine
    assert replicas.beat(session, "a", TIMEOUT_S, ["c1"]) == 0
    assert replica_ids(session) == {"a", "b"}
    assert engine_row(session, "e1") == (True, "a", "c1")
    assert engine_row(session, "e3") == (False, None, None)


def test_an_engine_connected_under_no_replica_is_reaped(session: Session) -> None:
    """A row left connected by a process that named no replica (before migration 0009)."""
    add_engines(session, "old")
    with session.begin():
        session.execute(update(Engine).values(connected=True))
    replicas.join(session, "a", TIMEOUT_S, is_only=False)
    assert engine_row(session, "old")[0] is False


def test_the_newest_socket_wins_the_goodbye(session: Session) -> None:
    add_engines(session, "e1")
    replicas.join(session, "a", TIMEOUT_S, is_only=False)
    replicas.join(session, "b", TIMEOUT_S, is_only=False)
    replicas.claim_engine(session, "e1", 1, "a", "old")
    replicas.claim_engine(session, "e1", 1, "b", "new")  # reconnected through another replica
    assert replicas.release_engine(session, "e1", "old") is False  # the older socket's goodbye
    assert engine_row(session, "e1") == (True, "b", "new")
    assert replicas.release_engine(session, "e1", "new") is True
    assert engine_row(session, "e1") == (False, None, None)


def test_a_claim_of_a_superseded_epoch_changes_nothing(session: Session) -> None:
    add_engines(session, "e1")
    replicas.join(session, "a", TIMEOUT_S, is_only=False)
    replicas.claim_engine(session, "e1", 0, "a", "stale")  # the row's epoch is 1
    assert engine_row(session, "e1") == (False, None, None)


def test_leaving_disconnects_the_replicas_engines(session: Session) -> None:
    add_engines(session, "e1", "e2")
    replicas.join(session, "a", TIMEOUT_S, is_only=False)
    replicas.join(session, "b", TIMEOUT_S, is_only=False)
    replicas.claim_engine(session, "e1", 1, "a", "c1")
    replicas.claim_engine(session, "e2", 1, "b", "c2")
    replicas.leave(session, "a")
    assert replica_ids(session) == {"b"}
    assert engine_row(session, "e1") == (False, None, None)
    assert engine_row(session, "e2") == (True, "b", "c2")


def test_the_only_process_of_a_sqlite_store_clears_what_others_left(session: Session) -> None:
    add_engines(session, "e1")
    replicas.join(session, "killed", TIMEOUT_S, is_only=False)
    replicas.claim_engine(session, "e1", 1, "killed", "c1")  # then killed -9: no goodbye
    replicas.join(session, "next", TIMEOUT_S, is_only=True)  # its heartbeat is fresh, but
    assert replica_ids(session) == {"next"}  # the lock says no other process is alive
    assert engine_row(session, "e1")[0] is False


# ---------------------------------------------------------------------------- SQLite lock
CLAIM = "import sys; from api.fleet.replicas import claim_sqlite; claim_sqlite(sys.argv[1])"


def claim_elsewhere(url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLAIM, url], capture_output=True, text=True)


def test_a_second_process_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'junction.db'}"
    lock = replicas.claim_sqlite(url)
    assert lock is not None
    again = replicas.claim_sqlite(url)  # this process again: the same claim
    assert again is lock
    refused = claim_elsewhere(url)
    assert refused.returncode != 0
    assert "SQLite takes one process only" in refused.stderr
    assert "JUNCTION_DATABASE_URL=postgresql://" in refused.stderr
    assert "pid " in refused.stderr  # who holds it
    replicas.release_sqlite(again)
    assert claim_elsewhere(url).returncode != 0  # one claim is still held
    replicas.release_sqlite(lock)
    assert claim_elsewhere(url).returncode == 0, claim_elsewhere(url).stderr


def test_other_stores_take_no_lock(tmp_path: Path) -> None:
    assert replicas.claim_sqlite("sqlite://") is None
    assert replicas.claim_sqlite("sqlite:///:memory:") is None
    assert replicas.claim_sqlite("postgresql+psycopg://u@h:5432/db") is None


def test_a_second_junction_api_on_one_sqlite_store_exits_2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'junction.db'}"
    first = ApiProcess(url, free_port())
    first.start()
    try:
        second = ApiProcess(url, free_port())
        with pytest.raises(RuntimeError, match="SQLite takes one process only") as refused:
            second.start()
        assert "JUNCTION_DATABASE_URL=postgresql://" in str(refused.value)
        assert second.process.returncode == 2
    finally:
        first.kill()
    after = ApiProcess(url, free_port())  # the kill -9 freed the lock: a restart serves
    after.start()
    after.kill()


# ---------------------------------------------------------------------------- LISTEN/NOTIFY
@pytest.fixture
def postgres_url(postgres: Postgres, postgres_template: str) -> Iterator[str]:
    name = postgres.create("junction_replicas", template=postgres_template)
    try:
        yield postgres.url(name)
    finally:
        postgres.drop(name)


@pytest.fixture
def postgres_session(postgres_url: str) -> Iterator[Session]:
    db = make_engine(postgres_url)
    with make_sessionmaker(db)() as session:
        yield session
    db.dispose()


class Heard:
    """What a listener heard, for the test to wait on."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, dict]] = []
        self.reconnects = 0
        self.changed = asyncio.Event()

    async def on_notify(self, channel: str, payload: dict) -> None:
        self.notes.append((channel, payload))
        self.changed.set()

    async def on_reconnect(self) -> None:
        self.reconnects += 1
        self.changed.set()

    async def until(self, check, timeout_s: float = 10.0) -> None:
        async def wait() -> None:
            while not check():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout_s)


def test_the_listener_carries_commands_and_takeovers_and_survives_a_cut(
    postgres_session: Session, postgres_url: str
) -> None:
    session = postgres_session

    async def scenario() -> None:
        heard, listening = Heard(), asyncio.Event()
        task = asyncio.create_task(
            replicas.listen(postgres_url, heard.on_notify, heard.on_reconnect, listening)
        )
        try:
            await asyncio.wait_for(listening.wait(), 10)
            with session.begin():  # delivered at the commit
                assert replicas.notify_commands(session, ["e1", "e2"], "p1", "pin") == 2
            with session.begin():
                replicas.notify_commands(session, ["rolled-back"], "p2", "pin")
                session.rollback()
            add_engines(session, "e3")
            replicas.claim_engine(session, "e3", 1, "b", "c9")
            await heard.until(lambda: len(heard.notes) == 3)
            assert heard.notes == [
                (replicas.COMMANDS, {"engine_id": "e1", "pin_id": "p1", "command": "pin"}),
                (replicas.COMMANDS, {"engine_id": "e2", "pin_id": "p1", "command": "pin"}),
                (replicas.TAKEOVER, {"engine_id": "e3", "connection_id": "c9"}),
            ]
            # the listener's connection is cut: it comes back, says so, and hears again
            database = session.get_bind().url.database
            with psycopg.connect(replicas.libpq_url(postgres_url), autocommit=True) as admin:
                cut = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND query LIKE 'LISTEN%%'",
                    (database,),
                ).fetchall()
            assert cut == [(True,)]
            await heard.until(lambda: heard.reconnects == 1)
            with session.begin():
                replicas.notify_commands(session, ["e1"], "p1", "unpin")
            await heard.until(lambda: len(heard.notes) == 4)
            assert heard.notes[-1][1]["command"] == "unpin"
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


def test_sqlite_has_no_notifications(session: Session) -> None:
    if session.get_bind().dialect.name != "sqlite":
        pytest.skip("PostgreSQL notifies")
    with session.begin():
        assert replicas.notify_commands(session, ["e1"], "p1", "pin") == 0


def test_replicas_lists_the_live_ones_and_marks_itself(client, session: Session) -> None:
    """The app's own row (written at its start) and another live replica's; one silent for
    the app's `replica_timeout_s` is not listed."""
    timeout_s = client.app.state.junction.settings.replica_timeout_s
    replicas.join(session, "other", timeout_s, is_only=False)
    replicas.join(session, "silent", timeout_s, is_only=False)
    add_engines(session, "e1")
    replicas.claim_engine(session, "e1", 1, "other", "c1")
    silence(session, "silent", timeout_s + 1)
    listed = client.get("/api/v1/replicas")
    assert listed.status_code == 200, listed.text
    by_id = {r["replica_id"]: r for r in listed.json()}
    (own,) = [r for r in by_id.values() if r["is_self"]]
    assert set(by_id) == {own["replica_id"], "other"}
    assert by_id["other"]["num_engines"] == 1 and own["num_engines"] == 0
    assert own["pid"] == os.getpid()
    assert client.get("/api/v1/engines/e1").json()["replica_id"] == "other"


def test_a_beat_between_a_hello_and_its_socket_added_keeps_the_engine_held(
    session: Session,
) -> None:
    """The hello names the socket holder in the store before the registry holds the socket: a
    beat in between took the engine for lost and disconnected it (seen as `replica_id` None
    right after the welcome, across replicas). The registry counts such a socket as held."""
    from api.fleet.registry import EngineRegistry

    replicas.join(session, "r1", TIMEOUT_S, is_only=False)
    add_engines(session, "opening")
    with session.begin():
        session.execute(
            update(Engine)
            .where(Engine.engine_id == "opening")
            .values(connected=True, replica_id="r1", connection_id="socket-1")
        )
    registry = EngineRegistry()
    registry.opening("socket-1")
    replicas.beat(session, "r1", TIMEOUT_S, registry.connection_ids())
    assert engine_row(session, "opening") == (True, "r1", "socket-1")
    registry.opened("socket-1")  # refused after all: no socket holds it
    replicas.beat(session, "r1", TIMEOUT_S, registry.connection_ids())
    assert engine_row(session, "opening")[:2] == (False, None)
