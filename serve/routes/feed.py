"""`WS /v1/cache/feed`: the engine's cache feed (`engine.feed`) for routers.

The keys are hashes of prompts, so reading them takes the engine's token
(`Authorization: Bearer ...`, the `--token` / `JUNCTION_API_TOKEN` it streams to the control
plane with); an engine started without one serves no feed. Close codes: 4401 a missing or wrong
token, 4403 no token configured (the reason says what to set), 1013 the subscriber fell behind
(reconnect: a new connection starts from a snapshot), 1011 the engine loop is not running.
"""

from __future__ import annotations

import secrets

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from engine.feed import (
    CLOSE_ENGINE_DEAD,
    CLOSE_FELL_BEHIND,
    CLOSE_NO_TOKEN,
    CLOSE_UNAUTHORIZED,
    bearer_token,
    loop_subscriber,
    relay,
)
from serve.deps import ServerState
from serve.request_stream import EngineDeadError

router = APIRouter(tags=["feed"])


@router.websocket("/v1/cache/feed")
async def cache_feed(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.server
    # accepted first: a close before the handshake reaches the client as a bare HTTP 403
    await websocket.accept()
    if state.feed is None or not state.feed_token:
        await websocket.close(
            CLOSE_NO_TOKEN,
            "this engine serves no cache feed: start junction serve with --token "
            "(or JUNCTION_API_TOKEN)",
        )
        return
    token = bearer_token(websocket.headers.get("authorization", ""))
    if not secrets.compare_digest(token, state.feed_token):
        await websocket.close(CLOSE_UNAUTHORIZED, "missing or wrong bearer token")
        return
    subscriber, ready = loop_subscriber()
    hub = state.feed
    try:
        first = await state.async_engine.call(lambda engine: hub.subscribe(engine, subscriber))
    except EngineDeadError as exc:
        await websocket.close(CLOSE_ENGINE_DEAD, str(exc)[:120])
        return
    try:
        await relay(first, subscriber, ready, websocket.send_bytes, hub.heartbeat)
        await websocket.close(CLOSE_FELL_BEHIND, "fell behind: reconnect for a snapshot")
    except (WebSocketDisconnect, RuntimeError, OSError):
        return  # the router went away
    finally:
        hub.unsubscribe(subscriber)
