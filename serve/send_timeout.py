"""`SendTimeout`: a websocket whose peer takes no data is dropped, not waited for.

A cache feed reader that stops reading (a frozen router, a hostile client) fills its TCP
window; the server's send to it then waits for the transport to drain, for good. The hub's
bound on waiting frames never sees it (the relay holds none: it is stuck in one send), nor
can a close frame reach it (it queues behind the same full buffer), and the reader held its
slot and its buffers as long as it liked (issue 47, item 9). So every websocket send of the
app must finish within `timeout_s`; one that does not aborts the connection (a TCP reset: the
one thing that reaches a peer that reads nothing) and raises `OSError` to the route, which
ends as for a reader gone away. The engine's step never waits on a reader either way: it only
queues frames (`engine.feed.subscriber`).

The transport is uvicorn's: the `send` an ASGI server hands the outermost app is its
protocol's bound method, which holds it. Under a server that hands something else the send is
still bounded, and the connection closes once the peer reads again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from engine.feed import DEFAULT_SEND_TIMEOUT_S, SEND_TIMEOUT_SETTING, reset

logger = logging.getLogger("serve")

DEFAULT_FEED_SEND_TIMEOUT_S = DEFAULT_SEND_TIMEOUT_S
FEED_SEND_TIMEOUT_SETTING = SEND_TIMEOUT_SETTING


class SendTimeout:
    """Pure ASGI middleware: bounds each websocket send by `timeout_s` (HTTP passes through)."""

    def __init__(self, app: Any, timeout_s: float = DEFAULT_FEED_SEND_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(
                f"the feed send timeout must be above 0 s, got {timeout_s} "
                f"({FEED_SEND_TIMEOUT_SETTING})"
            )
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def timed_send(message: dict) -> None:
            try:
                await asyncio.wait_for(send(message), self.timeout_s)
            except TimeoutError:
                client = scope.get("client")
                logger.warning(
                    "websocket %s: %s took no data for %.1f s (%s): dropped",
                    scope.get("path"),
                    f"{client[0]}:{client[1]}" if client else "a client",
                    self.timeout_s,
                    FEED_SEND_TIMEOUT_SETTING,
                )
                _abort(send)
                raise OSError("the websocket peer took no data: connection dropped") from None

        await self.app(scope, receive, timed_send)


def _abort(send: Any) -> None:
    """Reset the connection under `send`, when the server's send shows its transport."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if isinstance(transport, asyncio.BaseTransport) and hasattr(transport, "abort"):
        reset(transport)
