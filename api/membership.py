"""This replica's part in the fleet (`api.fleet.replicas`), for the app's lifespan and routes: its
row and heartbeat, the listener that takes the commands and takeovers other replicas write,
and the sending of commands to engines wherever their sockets are.

`start` runs before the app serves: the SQLite lock (a second process on one SQLite file is
refused), the replica's row (reaping the dead), and on PostgreSQL the listener, waited for
until its `LISTEN` is in place so that no command written meanwhile is missed. `stop` cancels
the background tasks and says goodbye (the replica's engines are marked disconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import anyio
import anyio.from_thread
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api.fleet import pins, replicas
from api.guards.errors import is_store_unavailable, store_unavailable_message
from api.state import AppState
from api.store.models import Pin
from engine.wire import CLOSE_SUPERSEDED, Command

log = logging.getLogger(__name__)
LISTEN_WAIT_S = 10.0  # at start, how long to wait for the listener before serving anyway


async def start(state: AppState) -> None:
    """Join the fleet: see the module's docstring. Raises `replicas.SingleProcessStore`."""
    url = state.settings.database_url
    state.sqlite_lock = replicas.claim_sqlite(url)
    timeout_s = state.settings.replica_timeout_s
    try:
        await anyio.to_thread.run_sync(_join, state, timeout_s)
    except SQLAlchemyError as exc:
        log.warning("could not write this replica's row (is the schema migrated?): %s", exc)
    state.tasks.append(asyncio.create_task(_heartbeats(state), name="replica heartbeat"))
    if replicas.is_postgres(url):
        listening = asyncio.Event()
        listener = replicas.listen(
            url, lambda c, p: on_notify(state, c, p), lambda: resend(state), listening
        )
        state.tasks.append(asyncio.create_task(listener, name="replica listener"))
        try:
            await asyncio.wait_for(listening.wait(), LISTEN_WAIT_S)
        except TimeoutError:
            log.warning("the replica listener is not listening yet: serving meanwhile")


async def stop(state: AppState) -> None:
    """Cancel the background tasks, then leave the fleet (best effort: a store out of reach
    leaves the row to time out)."""
    for task in state.tasks:
        task.cancel()
    for task in state.tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    state.tasks.clear()
    try:
        await anyio.to_thread.run_sync(_leave, state)
    except SQLAlchemyError as exc:
        log.warning("could not remove this replica's row: %s", exc)
    if state.sqlite_lock is not None:
        replicas.release_sqlite(state.sqlite_lock)
        state.sqlite_lock = None


def queue_command(
    session: Session, state: AppState, engine_ids: Iterable[str], command: Command
) -> list[str]:
    """Queue `command` for `engine_ids` in the caller's transaction; returns the engines held
    here, to send it to directly (`send_local`) after the caller's commit, so the command is
    on their sockets before the route answers.

    On PostgreSQL every engine also gets a NOTIFY, delivered at the commit to every replica,
    and the one holding the engine's socket at that moment sends it: an engine that moves
    between replicas meanwhile is covered either by that or, if it said hello after the
    commit, by its hello's commands. The NOTIFY names the socket this replica sends to itself,
    so that socket is not sent the command twice."""
    engine_ids = list(engine_ids)
    local = {
        engine_id: connection.connection_id
        for engine_id in engine_ids
        if (connection := state.registry.get(engine_id)) is not None
    }
    replicas.notify_commands(
        session,
        engine_ids,
        command.payload["pin_id"],
        command.command,
        sent_by=state.replica_id,
        sent_to=local,
    )
    return list(local)


def send_local(state: AppState, engine_ids: Iterable[str], command: Command) -> None:
    """From a route's worker thread, after its commit: `command` down the sockets this replica
    holds; one that fails is left to the engine's next hello, which resends what it is owed."""
    for engine_id in engine_ids:
        if engine_id not in state.registry:
            continue
        try:
            anyio.from_thread.run(state.registry.send_command, engine_id, command)
        except Exception as exc:  # the socket is going away; its next hello resends
            log.warning("could not send %s to engine %s: %s", command.command, engine_id, exc)


async def on_notify(state: AppState, channel: str, payload: dict) -> None:
    """A notification another replica (or this one) wrote: a takeover closes this replica's
    older socket of the engine; a command goes down the engine's socket, if it is here."""
    connection = state.registry.get(payload.get("engine_id", ""))
    if connection is None:
        return
    if channel == replicas.TAKEOVER:
        if connection.connection_id != payload.get("connection_id"):
            log.info(
                "engine %s reconnected elsewhere: closing its older socket", connection.engine_id
            )
            await connection.close(CLOSE_SUPERSEDED, "a newer connection of this engine took over")
    elif channel == replicas.COMMANDS:
        if payload.get("sent_by") == state.replica_id and (
            payload.get("connection_id") == connection.connection_id
        ):
            return  # `send_local` sent it down this very socket
        command = await anyio.to_thread.run_sync(_command, state, payload)
        if command is not None:
            await connection.send(command)


async def resend(state: AppState) -> None:
    """After the listener was away: each engine held here is sent what it is owed, as after
    its hello (notifications written meanwhile are lost; the pins are not)."""
    for connection in state.registry.connections():
        try:
            commands = await anyio.to_thread.run_sync(_owed, state, connection.engine_id)
            for command in commands:
                await connection.send(command)
        except Exception as exc:
            log.warning("could not resend the pins of engine %s: %s", connection.engine_id, exc)


# ---------------------------------------------------------------------------- helpers
async def _heartbeats(state: AppState) -> None:
    """Beat every `JUNCTION_REPLICA_HEARTBEAT_S`; a failure is logged once (a long outage
    would repeat it every beat), and so is the first beat after it."""
    settings, failing = state.settings, False
    while True:
        await asyncio.sleep(settings.replica_heartbeat_s)
        try:
            await anyio.to_thread.run_sync(_beat, state)
        except Exception as exc:
            detail = store_unavailable_message(exc) if is_store_unavailable(exc) else repr(exc)
            log.log(
                logging.DEBUG if failing else logging.WARNING,
                "replica heartbeat failed: %s",
                detail,
            )
            failing = True
        else:
            if failing:
                log.warning("replica heartbeat is back")
            failing = False


def _join(state: AppState, timeout_s: float) -> None:
    with state.sessions() as session:
        replicas.join(session, state.replica_id, timeout_s, is_only=state.sqlite_lock is not None)


def _beat(state: AppState) -> None:
    ids = state.registry.connection_ids()
    with state.sessions() as session:
        replicas.beat(session, state.replica_id, state.settings.replica_timeout_s, ids)


def _leave(state: AppState) -> None:
    with state.sessions() as session:
        replicas.leave(session, state.replica_id)


def _command(state: AppState, payload: dict) -> Command | None:
    if payload.get("command") == "unpin":
        return pins.unpin_command(payload["pin_id"])
    with state.sessions() as session:
        pin = session.get(Pin, payload.get("pin_id"))
        if pin is None or pin.released_at is not None or pin.token_ids is None:
            return None
        return pins.pin_command(pin)


def _owed(state: AppState, engine_id: str) -> list[Command]:
    with state.sessions() as session:
        return pins.hello_commands(session, engine_id)
