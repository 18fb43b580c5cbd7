"""One router's end of the feed: the frames waiting for it, and the loop that relays them
(with a heartbeat while none comes). A subscriber that cannot keep up is closed, not slowed
down: it reconnects and starts again from a snapshot."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import threading
from collections.abc import Awaitable, Callable

HEARTBEAT_S = 0.5
#: Seconds one send to a reader may wait for it to take data (`--feed-send-timeout`).
DEFAULT_SEND_TIMEOUT_S = 5.0
SEND_TIMEOUT_SETTING = "--feed-send-timeout, JUNCTION_FEED_SEND_TIMEOUT_S"
#: Frames one subscriber may have waiting; past it the subscriber is dropped (it resyncs).
MAX_PENDING_FRAMES = 4096


class FeedSubscriber:
    """One router's end of the feed. `push` runs on the engine thread and calls `wake` (which
    must be thread-safe: `loop.call_soon_threadsafe(event.set)`); the reader calls `take`."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.lock = threading.Lock()
        self.frames: list[bytes] = []
        self.is_closed = False  # fell behind, or unsubscribed: the reader resyncs or is gone

    def push(self, frame: bytes) -> None:
        with self.lock:
            if self.is_closed:
                return
            if len(self.frames) >= MAX_PENDING_FRAMES:
                self.is_closed = True
                self.frames = []
            else:
                self.frames.append(frame)
        self.wake()

    def take(self) -> list[bytes]:
        """The frames pushed so far, oldest first."""
        with self.lock:
            frames, self.frames = self.frames, []
        return frames


def bearer_token(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` header's value; "" for any other."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def loop_subscriber() -> tuple[FeedSubscriber, asyncio.Event]:
    """A subscriber whose pushes, from any thread, set an event of the running loop."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    return FeedSubscriber(lambda: loop.call_soon_threadsafe(ready.set)), ready


async def relay(
    first: list[bytes],
    subscriber: FeedSubscriber,
    ready: asyncio.Event,
    send: Callable[[bytes], Awaitable[None]],
    heartbeat: Callable[[], bytes],
) -> None:
    """Send `first` (the hello and snapshot), then the frames pushed to `subscriber` as they
    come, and `heartbeat()` every `HEARTBEAT_S` while none does. Returns once the subscriber
    is closed (it fell behind, or the feed dropped it); a failed `send` raises."""
    for frame in first:
        await send(frame)
    while True:
        try:
            await asyncio.wait_for(ready.wait(), HEARTBEAT_S)
        except TimeoutError:
            await send(heartbeat())
            continue
        ready.clear()
        for frame in subscriber.take():
            await send(frame)
        if subscriber.is_closed:
            return


def add_send_timeout_option(parser: argparse.ArgumentParser) -> None:
    """`--feed-send-timeout`, for each command that serves a cache feed (`junction serve`,
    `junction attach --feed-port`)."""
    parser.add_argument(
        "--feed-send-timeout",
        type=send_timeout_s,
        default=os.environ.get("JUNCTION_FEED_SEND_TIMEOUT_S", str(DEFAULT_SEND_TIMEOUT_S)),
        metavar="SECONDS",
        help="a cache feed reader that takes no data for this long is reset (default "
        f"{DEFAULT_SEND_TIMEOUT_S:g}; JUNCTION_FEED_SEND_TIMEOUT_S)",
    )


def send_timeout_s(value: str) -> float:
    """`--feed-send-timeout`'s check: a number of seconds above 0."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a number of seconds above 0 (JUNCTION_FEED_SEND_TIMEOUT_S)"
        )
    return seconds


def reset(transport: asyncio.BaseTransport) -> None:
    """Reset a reader's connection: with no linger, so the kernel drops the unsent bytes (a
    plain close would leave them, and the FIN behind them, for a peer whose window stays
    shut: the one thing that reaches a reader that reads nothing is a reset)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already gone
    transport.abort()
