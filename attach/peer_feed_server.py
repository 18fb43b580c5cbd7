"""`junction attach --feed-port`: a bridged peer's cache feed (`attach.bridge.peer_feed`)
served as `WS /v1/cache/feed`, as an engine serves its own (`serve/routes/feed.py`): the same
frames, the same bearer token (the attach's `--token`) and close codes, so `junction route
--engine http://HOST:FEED_PORT` follows the peer like an engine and sends its requests to the
hello's `serve_url`.

A small websockets server on a thread of its own (the bridge's loop keeps the main thread).
Close codes: 4401 a missing or wrong token; 1013 the subscriber fell behind, the feed's
geometry changed, or `PeerFeed.max_subscribers` follow already (reconnect: a new connection
starts from a hello and a snapshot). Any other path is answered 404. A reader that takes no
data for `send_timeout_s` (`--feed-send-timeout`) is reset, as the engine's own feed does
(`serve.send_timeout`): a send to it would wait for good, holding its slot, and no close frame
passes a full buffer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from http import HTTPStatus

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from attach.bridge.peer_feed import PeerFeed, Subscription
from engine.feed import (
    CLOSE_FELL_BEHIND,
    CLOSE_UNAUTHORIZED,
    DEFAULT_SEND_TIMEOUT_S,
    SEND_TIMEOUT_SETTING,
    bearer_token,
    loop_subscriber,
    relay,
    reset,
)

log = logging.getLogger("attach.bridge")

FEED_PATH = "/v1/cache/feed"
START_TIMEOUT_S = 10.0


def _only_the_feed(connection: ServerConnection, request: Request) -> Response | None:
    if request.path.partition("?")[0] != FEED_PATH:
        return connection.respond(HTTPStatus.NOT_FOUND, f"only {FEED_PATH} is served here\n")
    return None


class PeerFeedServer:
    def __init__(
        self,
        feed: PeerFeed,
        token: str,
        host: str,
        port: int,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self.feed, self.token = feed, token
        self.send_timeout_s = send_timeout_s
        self.host, self.port = host, port  # port 0: a free one, known once started
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping: asyncio.Event | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> int:
        """Serve on a thread; the port, once bound (`OSError` when it cannot be)."""
        self.thread = threading.Thread(target=self._run, name="peer-feed", daemon=True)
        self.thread.start()
        if not self.ready.wait(START_TIMEOUT_S):
            raise OSError(f"the cache feed did not start within {START_TIMEOUT_S:g} s")
        if self.error is not None:
            raise OSError(f"cannot serve the cache feed: {self.error}") from self.error
        return self.port

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.loop is not None and self.stopping is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
        if self.thread is not None:
            self.thread.join(timeout_s)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - said by `start`
            self.error = exc
            self.ready.set()

    async def _serve(self) -> None:
        self.loop, self.stopping = asyncio.get_running_loop(), asyncio.Event()
        async with serve(
            self._follow,
            self.host,
            self.port,
            process_request=_only_the_feed,
            compression=None,  # keys are hashes: nothing to compress
            ping_interval=None,  # the heartbeats keep it alive
            max_size=2**16,  # a router sends nothing
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            log.info("serving the cache feed at ws://%s:%d%s", self.host, self.port, FEED_PATH)
            self.ready.set()
            await self.stopping.wait()

    async def _follow(self, connection: ServerConnection) -> None:
        """One router: the hello and snapshot, then deltas, heartbeats while idle."""
        token = bearer_token(connection.request.headers.get("authorization", ""))
        if not secrets.compare_digest(token, self.token):
            await connection.close(CLOSE_UNAUTHORIZED, "missing or wrong bearer token")
            return
        subscriber, ready = loop_subscriber()
        subscription = self.feed.subscribe(subscriber)
        if subscription is None:
            num = self.feed.max_subscribers
            reason = f"{num} routers follow this feed already: try again later"
            await connection.close(CLOSE_FELL_BEHIND, reason)
            return

        async def send(frame: bytes) -> None:
            try:
                await asyncio.wait_for(connection.send(frame), self.send_timeout_s)
            except TimeoutError:
                log.warning(
                    "cache feed: a router took no data for %g s: reset (%s)",
                    self.send_timeout_s,
                    SEND_TIMEOUT_SETTING,
                )
                reset(connection.transport)
                raise OSError("the router took no data") from None

        try:
            await relay(subscription.frames, subscriber, ready, send, self.feed.heartbeat)
            await connection.close(CLOSE_FELL_BEHIND, self._closed_reason(subscription))
        except (ConnectionClosed, OSError):
            return  # the router went away
        finally:
            self.feed.unsubscribe(subscriber)

    def _closed_reason(self, subscription: Subscription) -> str:
        if self.feed.epoch != subscription.epoch:
            return "the feed's geometry changed: reconnect for the new hello"
        return "fell behind: reconnect for a snapshot"
