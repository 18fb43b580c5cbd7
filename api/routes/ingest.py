"""The ingest socket: engines stream their event batches here (protocol: `engine.wire`).

Per connection: the `Origin`, when one is sent (a browser's; engines send none), must be one
of `JUNCTION_ALLOWED_ORIGINS` (else 4403: a page elsewhere cannot have a visitor's browser
stream into the store); then the write token (header, or `?token=` for browsers), then a hello
answered by a welcome and the pin commands the engine is owed (`api.fleet.pins.hello_commands`: its
active pins, again after a reconnect or a restart), then batches and snapshots, each committed
before its ack (and followed by any command its pin reports call for). The newest hello of
an engine wins: it is recorded as held by this replica (`api.fleet.replicas.claim_engine`), and an
older socket of the engine is closed with 4410, here at once, on another replica when the
claim's notification reaches it; a hello of another engine process for an id whose holder is
live is refused instead (`api.ingest.lease`, 4411). Bad input closes the socket with the
wire's close code and a reason, is logged, and leaves the store unchanged (the frame's
transaction rolls back). Replies use the encoding of the engine's hello.

Frames are committed in order; the frames behind the one being committed are decoded
meanwhile (in worker threads), so validation overlaps the database's work. Batches that queued
up decoded behind one another are committed in one transaction (`apply_batches`), then acked
one by one; should that transaction fail, they are committed one at a time, so the frames
before a bad one are stored and acked and it is refused as it would be alone. A frame that
fails to decode is answered when its turn comes, after the frames before it.

A batch or snapshot that decodes but that the database refuses (`api.ingest.frames.Unstorable`: a
constraint, a value beyond its column, a limit) is parked as a dead letter (`apply_parked`)
and acknowledged, so one poison frame cannot stop the stream; only a store out of reach
closes with 1013 ("try again"), and an internal error with 1011, each naming the seq.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import NamedTuple

import anyio
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from api.attribution.record import AttributionConfig
from api.deps import StateDep, is_valid_token
from api.fleet import replicas
from api.fleet.pins import hello_commands
from api.fleet.registry import Connection, close_websocket
from api.guards.errors import is_store_unavailable, store_unavailable_message
from api.guards.token import bearer_token
from api.ingest.frames import (
    Applied,
    Unstorable,
    apply_batch,
    apply_batches,
    apply_hello,
    apply_parked,
    apply_snapshot,
    park_items,
    split_unstorable,
)
from api.ingest.lease import LeaseConfig
from api.ingest.snapshot_chunks import SnapshotChunks
from api.peers.blocks import PeerConfig
from api.state import AppState
from engine.wire import (
    CLOSE_BAD_FRAME,
    CLOSE_STOPPING,
    CLOSE_SUPERSEDED,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    Batch,
    Command,
    Hello,
    Snapshot,
    Welcome,
    WireError,
    decode,
)

router = APIRouter(tags=["ingest"])
log = logging.getLogger(__name__)
GOODBYE_CODE = "junction.goodbye_code"  # the scope key of the close code the engine sent
CLOSE_INTERNAL = 1011
CLOSE_FORBIDDEN_ORIGIN = 4403
# Frames decoded ahead of the ones being committed: up to DECODE_AHEAD of them, while they
# hold less than AHEAD_BYTES (so a few big frames, snapshots, do not pile up). A backlog is
# committed that many frames a transaction: the later rows of a block replace the earlier
# ones before they reach the database, so 256 rather than 32 halved the CPU per event, of
# this process and of PostgreSQL's backend (benchmarks/ingest.py's breakdown and replicas).
DECODE_AHEAD = 256
AHEAD_BYTES = 8 * 1024 * 1024


class FrameFailed(Exception):
    """What failed applying frame `seq` (its `__cause__`), for a close reason that names it."""

    def __init__(self, seq: int | None) -> None:
        super().__init__(f"applying seq {seq}")
        self.seq = seq


class Pending(NamedTuple):
    received: float  # perf_counter() at arrival: the ingest latency runs from here to the ack
    size: int  # bytes of the frame
    frame: asyncio.Future  # the decoded frame, or the WireError that decoding raised


@router.websocket("/ingest")
async def ingest(websocket: WebSocket, state: StateDep) -> None:
    await websocket.accept()  # accept first, so a refusal can carry a close code and reason
    token = bearer_token(websocket.headers.get("authorization"))
    token = token or websocket.query_params.get("token")
    peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
    origin = websocket.headers.get("origin")
    if origin is not None and not is_allowed_origin(state, origin):
        reason = f"origin {origin} is not in JUNCTION_ALLOWED_ORIGINS"
        await _reject(state, websocket, WireError(CLOSE_FORBIDDEN_ORIGIN, reason), f"at {peer}")
        return
    if not is_valid_token(state, token):
        reason = "missing bearer token" if token is None else "wrong bearer token"
        await _reject(state, websocket, WireError(CLOSE_UNAUTHORIZED, reason), f"at {peer}")
        return
    hello: Hello | None = None
    connection: Connection | None = None
    try:
        data = await _receive(websocket)
        if data is None:
            return
        connection_id = replicas.new_connection_id()
        state.registry.opening(connection_id)  # the hello names it holder before it is added
        try:
            hello, welcome = await in_ingest_thread(state, _hello, state, data, connection_id)
            connection = Connection(
                hello.engine_id,
                hello.epoch,
                websocket,
                is_binary=isinstance(data, bytes),
                connection_id=connection_id,
            )
            # the newest hello wins: an older socket of the engine here is closed now, one on
            # another replica by that replica when the claim's notification reaches it
            older = state.registry.add(connection)
        finally:
            state.registry.opened(connection_id)
        state.metrics.connected_engines.set(len(state.registry))
        await in_ingest_thread(state, _claim, state, connection)
        if older is not None:
            await older.close(CLOSE_SUPERSEDED, "a newer connection of this engine took over")
        log.info(
            "engine %s connected from %s: epoch %d, next seq %d",
            hello.engine_id,
            peer,
            hello.epoch,
            welcome.next_seq,
        )
        await connection.send(welcome)
        # registered before the pins are read: a pin made meanwhile is sent by its route
        for command in await in_ingest_thread(state, _hello_commands, state, hello.engine_id):
            await connection.send(command)
        await _stream(state, websocket, connection, hello)
    except WireError as exc:
        await _reject(state, websocket, exc, hello.engine_id if hello else f"at {peer}")
    except WebSocketDisconnect:
        pass
    except Exception as exc:
        who = hello.engine_id if hello else f"at {peer}"
        at = f" at seq {exc.seq}" if isinstance(exc, FrameFailed) else ""
        cause = exc.__cause__ if isinstance(exc, FrameFailed) else exc
        # only a store out of reach is "try again": what it refuses was parked, never comes here
        if cause is not None and is_store_unavailable(cause):  # rolled back, unacked: resent
            log.warning("ingest: engine %s%s: %s", who, at, store_unavailable_message(cause))
            await _close(websocket, CLOSE_TRY_AGAIN, f"store unavailable{at}, retry later")
            return
        log.exception("ingest: internal error on the socket of engine %s%s", who, at)
        await _close(websocket, CLOSE_INTERNAL, f"internal error{at}")
    finally:
        if connection is not None and state.registry.remove(connection):
            state.metrics.connected_engines.set(len(state.registry))
            with anyio.CancelScope(shield=True):  # a cancelled handler still says goodbye
                stopping = websocket.scope.get(GOODBYE_CODE) == CLOSE_STOPPING
                await in_ingest_thread(state, _disconnected, state, connection, stopping)
            log.info("engine %s disconnected", connection.engine_id)


def is_allowed_origin(state: AppState, origin: str) -> bool:
    """Whether a browser page from `origin` may open the socket (scheme and host compared
    without case, a trailing slash ignored)."""
    allowed = {o.rstrip("/").lower() for o in state.settings.allowed_origins}
    return origin.rstrip("/").lower() in allowed


async def _stream(
    state: AppState, websocket: WebSocket, connection: Connection, hello: Hello
) -> None:
    """Commit and ack the connection's frames in order until it closes or one is refused."""
    pending: asyncio.Queue[Pending | None] = asyncio.Queue(DECODE_AHEAD)
    queued = 0  # bytes of the frames in `pending`
    has_room = asyncio.Event()  # set while they are fewer than AHEAD_BYTES
    has_room.set()

    async def read() -> None:
        nonlocal queued
        try:
            while (data := await _receive(websocket)) is not None:
                await has_room.wait()
                decoding = in_ingest_thread(state, decode, data, state.settings.max_frame_bytes)
                queued += len(data)
                if queued >= AHEAD_BYTES:
                    has_room.clear()
                item = Pending(time.perf_counter(), len(data), asyncio.ensure_future(decoding))
                await pending.put(item)
        except Exception as exc:  # hand it over in its turn
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            await pending.put(Pending(time.perf_counter(), 0, failed))
        await pending.put(None)

    def taken(item: Pending | None) -> Pending | None:
        nonlocal queued
        if item is not None:
            queued -= item.size
            if queued < AHEAD_BYTES:
                has_room.set()
        return item

    reader = asyncio.create_task(read())
    is_open = True
    ahead: list[Pending | None] = []  # one taken from the queue that could not join a group
    # a snapshot in several frames, its chunks held against the process's budget
    chunks = SnapshotChunks(state.settings.max_snapshot_bytes, state.snapshot_budget)
    idle_s = state.settings.snapshot_idle_s
    try:
        while (
            item := ahead.pop() if ahead else taken(await _next(pending, chunks, idle_s))
        ) is not None:
            group, frames = [item], [await item.frame]
            if isinstance(frames[0], Snapshot):
                whole = chunks.add(frames[0], item.size)
                if whole is None:
                    continue  # acknowledged with the last chunk
                frames = [whole]
            elif chunks.is_pending:
                raise WireError(
                    CLOSE_BAD_FRAME, f"a {frames[0].type} frame inside a snapshot's chunks"
                )
            while isinstance(frames[0], Batch) and not pending.empty():
                following = taken(pending.get_nowait())
                if following is None or not _is_decoded_batch(following.frame):
                    ahead.append(following)
                    break
                group.append(following)
                frames.append(following.frame.result())
            results = await in_ingest_thread(state, _apply_group, state, hello, frames)
            is_open = await _acknowledge(state, connection, group, frames, results, is_open)
    finally:
        chunks.clear()
        reader.cancel()
        while not pending.empty():  # frames behind a refused one: let them go quietly
            ahead.append(pending.get_nowait())
        for item in ahead:
            if item is not None:
                item.frame.add_done_callback(lambda f: f.cancelled() or f.exception())


async def _next(
    pending: asyncio.Queue[Pending | None], chunks: SnapshotChunks, idle_s: float
) -> Pending | None:
    """The next frame; while a snapshot is half-sent (its chunks hold their bytes), only if it
    comes within `idle_s`, else a 1013 "send it again"."""
    if not chunks.is_pending:
        return await pending.get()
    try:
        return await asyncio.wait_for(pending.get(), idle_s)
    except TimeoutError:
        raise WireError(
            CLOSE_TRY_AGAIN,
            f"a snapshot's next chunk did not come in {idle_s:g} s "
            "(JUNCTION_SNAPSHOT_IDLE_S): send it again",
        ) from None


async def _acknowledge(
    state: AppState,
    connection: Connection,
    group: list[Pending],
    frames: list,
    results: list,
    is_open: bool,
) -> bool:
    """Ack each committed frame of the group (and send its commands) while the socket is open;
    raise for the one refused. Whether the socket is still open."""
    for done, frame, applied in zip(group, frames, results, strict=False):
        if isinstance(applied, WireError):
            raise applied
        if isinstance(applied, Exception):
            raise FrameFailed(getattr(frame, "seq", None)) from applied
        if is_open:  # frames that arrived before the peer left are committed all the same
            try:
                await connection.send(applied.ack)
                for command in applied.commands:
                    await connection.send(command)
            except (WebSocketDisconnect, RuntimeError):
                is_open = False
        state.metrics.latency.observe(time.perf_counter() - done.received)
    return is_open


def in_ingest_thread(state: AppState, fn, *args):
    """`fn(*args)` in a worker thread of the ingest's own limiter (`AppState.ingest_threads`)."""
    return anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=state.ingest_threads)


async def _receive(websocket: WebSocket) -> str | bytes | None:
    """The next frame's payload; None once the peer has gone."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            websocket.scope[GOODBYE_CODE] = message.get("code")
            return None
        data = message.get("bytes")
        if data is None:
            data = message.get("text")
        if data is not None:
            return data


def _hello(state: AppState, data: str | bytes, connection_id: str) -> tuple[Hello, Welcome]:
    frame = decode(data, max_bytes=state.settings.max_frame_bytes)
    if not isinstance(frame, Hello):
        raise WireError(CLOSE_BAD_FRAME, f"first frame must be hello, got {frame.type}")
    settings = state.settings
    with state.sessions() as session:
        welcome = apply_hello(
            session,
            frame,
            settings.hit_rate_bucket_s,
            LeaseConfig.from_settings(settings),
            (state.replica_id, connection_id),
        )
        return frame, welcome


def _claim(state: AppState, connection: Connection) -> None:
    with state.sessions() as session:
        replicas.claim_engine(
            session,
            connection.engine_id,
            connection.epoch,
            state.replica_id,
            connection.connection_id,
        )


def _hello_commands(state: AppState, engine_id: str) -> list[Command]:
    with state.sessions() as session:
        return hello_commands(session, engine_id)


def _is_decoded_batch(future: asyncio.Future) -> bool:
    if not future.done() or future.cancelled() or future.exception() is not None:
        return False
    return isinstance(future.result(), Batch)


def _apply_group(state: AppState, hello: Hello, frames: list) -> list[Applied | Exception]:
    """The frames' results in order; the last may be the exception that refused a frame."""
    if len(frames) > 1:
        try:
            with state.sessions() as session:
                group = apply_batches(
                    session,
                    hello,
                    frames,
                    state.settings.hit_rate_bucket_s,
                    _config(state),
                    PeerConfig.from_settings(state.settings),
                )
        except Exception:
            pass  # one at a time below: the frames before the bad one are committed
        else:
            for frame, applied in zip(frames, group, strict=True):
                _count(state, frame, applied)
            return group
    results: list[Applied | Exception] = []
    for frame in frames:
        try:
            try:
                results.append(_apply(state, hello, frame))
            except Unstorable as refused:  # retrying cannot help: park it and go on
                if not isinstance(frame, Batch | Snapshot):
                    raise
                results.append(_park(state, hello, frame, refused))
        except Exception as exc:
            return [*results, exc]
    return results


def _park(state: AppState, hello: Hello, frame: Batch | Snapshot, refused: Unstorable) -> Applied:
    """Store what of a refused frame the store can hold and park the rest: the finished
    requests it cannot hold alone when they explain the refusal, else the whole frame."""
    settings = state.settings
    split = split_unstorable(frame)
    if split is not None:
        kept, bad, why = split
        try:
            applied = _apply(state, hello, kept)
        except Unstorable:
            pass  # something else is refused too: the whole frame goes
        else:
            with state.sessions() as session:
                park_items(
                    session,
                    hello,
                    bad,
                    why,
                    settings.dead_letters_per_engine,
                    settings.dead_letter_frame_bytes,
                )
            state.metrics.dead_letters.inc()
            log.warning(
                "ingest: engine %s: %s %d stored without what it could not hold, parked: %s",
                hello.engine_id,
                frame.type,
                frame.seq,
                why,
            )
            return applied
    with state.sessions() as session:
        applied = apply_parked(
            session,
            hello,
            frame,
            refused.reason,
            settings.dead_letters_per_engine,
            settings.dead_letter_frame_bytes,
        )
    if applied.is_parked:
        log.warning(
            "ingest: engine %s: %s %d parked as a dead letter: %s",
            hello.engine_id,
            frame.type,
            frame.seq,
            refused.reason,
        )
    _count(state, frame, applied)
    return applied


def _apply(state: AppState, hello: Hello, frame: object) -> Applied:
    with state.sessions() as session:
        bucket_s, config = state.settings.hit_rate_bucket_s, _config(state)
        if isinstance(frame, Batch):
            peer = PeerConfig.from_settings(state.settings)
            applied = apply_batch(session, hello, frame, bucket_s, config, peer)
        elif isinstance(frame, Snapshot):
            applied = apply_snapshot(session, hello, frame, bucket_s, config)
        elif isinstance(frame, Hello):
            raise WireError(CLOSE_BAD_FRAME, "a second hello on one connection")
        else:
            raise WireError(CLOSE_BAD_FRAME, f"an engine does not send {frame.type} frames")
    _count(state, frame, applied)
    return applied


def _config(state: AppState) -> AttributionConfig:
    """Miss attribution's settings (`JUNCTION_ATTRIBUTION_*`)."""
    return AttributionConfig.from_settings(state.settings)


def _count(state: AppState, frame: object, applied: Applied) -> None:
    metrics = state.metrics
    if applied.is_duplicate:
        metrics.duplicate_batches.inc()
    elif applied.is_parked:
        metrics.dead_letters.inc()
    elif isinstance(frame, Snapshot):
        metrics.snapshots.inc()
    else:
        metrics.batches.inc()
        metrics.events.inc(applied.num_events)


def _disconnected(state: AppState, connection: Connection, stopping: bool = False) -> None:
    """Mark the engine disconnected; `stopping` (its goodbye said it stops) ends its lease on
    the id too, so a restart need not wait `JUNCTION_ENGINE_LEASE_S`."""
    try:
        with state.sessions() as session:
            replicas.release_engine(
                session, connection.engine_id, connection.connection_id, end_lease=stopping
            )
    except Exception as exc:
        if not is_store_unavailable(exc):
            raise
        # the flag stays set until the engine's next hello, or until this replica is gone
        log.warning(
            "ingest: could not mark engine %s disconnected: %s",
            connection.engine_id,
            store_unavailable_message(exc),
        )


async def _reject(state: AppState, websocket: WebSocket, error: WireError, who: str) -> None:
    log.warning("ingest: closing the socket of engine %s: %d %s", who, error.code, error.reason)
    state.metrics.rejected_frames.labels(code=str(error.code)).inc()
    await _close(websocket, error.code, error.reason)


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    await close_websocket(websocket, code, reason)
