"""`EventPublisher`: the engine's cache events, batched on the engine thread, streamed to the
control plane's ingest socket by a background thread (docs/events.md, `engine/wire.py`).

The engine thread only batches: after every step a listener drains the engine's `ListSink`
into one `batch` frame with the next seq and puts it in the `Outbox` (outbox.py), the bounded
buffer of frames the store has not acknowledged; no step ever waits on the network.
`PublisherLink` (publisher_link.py) owns the socket: hello, welcome (the seq the store wants
next), resend from there, stream, drop what the cumulative acks cover, reconnect with backoff.
Both sides meet only in the outbox.

The store always converges to the engine's block table: when the buffer overflows (the control
plane away too long) or the store has a gap the buffer cannot fill, everything unacknowledged is
replaced by one `snapshot` of the table, built on the engine thread so it matches the engine's
state, with the next seq; batches after it continue from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from engine.wire import (
    MAX_FRAME_BYTES,
    SCHEMA_VERSION,
    Batch,
    BlockRow,
    Command,
    Hello,
    PinUpdated,
    Snapshot,
    new_instance_id,
)
from publish.outbox import DEFAULT_MAX_BATCHES, DEFAULT_MAX_BYTES, Outbox
from publish.publisher_link import Backoff, PublisherLink, ingest_url

if TYPE_CHECKING:
    import threading

    from engine.engine import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherStats:
    num_sent: int  # frames sent, resends and snapshots included
    num_resent: int  # frames sent again after a reconnect
    num_acked: int  # frames the store acknowledged, or already held when it said welcome
    num_dropped: int  # batches dropped unacknowledged for a snapshot (overflow or a gap)
    num_snapshots: int  # snapshot frames sent
    num_buffered: int  # frames waiting for an ack
    num_buffered_bytes: int  # their encoded bytes (a snapshot's table not counted)
    num_requests_waiting: int  # finished requests not yet acknowledged
    num_requests_dropped: int  # finished requests given up (`last_drop` says why)
    last_drop: str | None
    num_connections: int  # connections that got as far as a welcome
    is_connected: bool
    last_error: str | None


def put_snapshot(
    outbox: Outbox,
    engine_id: str,
    epoch: int,
    blocks: list[BlockRow | dict],
    pins: list[PinUpdated] | None = None,
) -> None:
    """Replace every unacknowledged frame in `outbox` with one snapshot of `blocks` and `pins`
    (the whole table), the finished requests of the frames it replaces riding along, and what
    the outbox gave up so far in this epoch. The one builder of snapshot frames: an engine's
    publisher and a `junction attach` bridge (its table travels as batches after an empty one)
    both call it."""
    ts = time.time()
    outbox.put_snapshot(
        lambda seq, requests: Snapshot(
            engine_id=engine_id,
            epoch=epoch,
            seq=seq,
            ts=ts,
            blocks=blocks,
            pins=pins or [],
            requests=requests,
            num_batches_dropped=outbox.num_dropped,
            num_requests_dropped=outbox.num_requests_dropped,
            last_drop=outbox.last_drop,
        )
    )


class EventPublisher:
    """Streams one engine's events to `control_plane` (`http(s)://host:port` or `ws(s)://...`).

    `on_command(Command)` runs on the publisher's reader thread for every command the control
    plane sends; hand the work to the engine thread from there. Nothing here raises into the
    engine: failures are logged, counted in `stats()`, and retried.
    """

    def __init__(
        self,
        control_plane: str,
        token: str,
        *,
        model: dict[str, Any] | None = None,
        binary: bool = False,
        max_batches: int = DEFAULT_MAX_BATCHES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_command: Callable[[Command], None] | None = None,
        backoff: Backoff | None = None,
        open_timeout_s: float = 5.0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if not token:
            raise ValueError("a bearer token for the control plane is required")
        self.outbox = Outbox(max_batches, max_bytes, binary=binary, max_frame_bytes=max_frame_bytes)
        self.url = ingest_url(control_plane)
        self.token = token
        self.model = model
        self.binary = binary
        self.on_command = on_command
        self.backoff = backoff or Backoff()
        self.open_timeout_s = open_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.engine: Engine | None = None
        self.engine_id = ""
        self.epoch = 0
        self.link: PublisherLink | None = None
        self.closed = False

    @property
    def cond(self) -> threading.Condition:
        """The outbox's lock: holding it keeps frames from the sender."""
        return self.outbox.cond

    @property
    def next_seq(self) -> int:
        return self.outbox.next_seq

    @property
    def needs_snapshot(self) -> bool:
        return self.outbox.needs_snapshot

    # ------------------------------------------------------------------ engine side
    def attach(
        self,
        engine: Engine,
        call_on_engine: Callable[[Callable[[Engine], None]], Any] | None = None,
    ) -> None:
        """Publish `engine`'s events; call on the engine's thread, or before it steps.

        `call_on_engine(fn)` runs `fn(engine)` on the engine thread and may return a coroutine,
        which the publisher's thread runs to the end (`AsyncEngine.call` fits): with it a
        snapshot the store asks for is built even while the engine idles; without it, after the
        next step or in `flush`.
        """
        if self.engine is not None:
            raise RuntimeError("this publisher is already attached to an engine")
        if not callable(getattr(engine.sink, "drain", None)):
            raise TypeError(f"the engine's sink must be a ListSink, got {type(engine.sink)!r}")
        self.engine = engine
        self.engine_id, self.epoch = engine.engine_id, engine.epoch
        hello = Hello(
            version=SCHEMA_VERSION,
            engine_id=self.engine_id,
            epoch=self.epoch,
            instance_id=new_instance_id(),  # this process: another with our id is refused
            # the block counts per group let a store lay out a new epoch's table before rows come
            geometry=engine.cache_geometry(),
            model=self.model if self.model is not None else {"name": engine.model_config.name},
        )
        if engine.num_steps or engine.pins:
            self.outbox.ask_snapshot()  # events before we came may be gone: start from the table
        engine.step_listeners.append(self.on_step)
        self.on_step(engine)
        build_snapshot = partial(call_on_engine, self.on_step) if call_on_engine else None
        self.link = PublisherLink(
            self.outbox,
            self.url,
            self.token,
            hello,
            binary=self.binary,
            backoff=self.backoff,
            open_timeout_s=self.open_timeout_s,
            max_frame_bytes=self.max_frame_bytes,
            on_command=self._command,
            build_snapshot=build_snapshot,
        )
        self.link.start()

    def on_step(self, engine: Engine) -> None:
        """The step listener: O(events) work, a deque append and a notify; never raises."""
        if self.closed:
            return
        try:
            events = engine.sink.drain()
            if self.outbox.needs_snapshot:
                if events:  # the snapshot holds their blocks; their requests ride in it
                    self.outbox.hold_requests(events)
                self.enqueue_snapshot(engine)
                return
            if not events:
                return
            ts = time.time()
            if self.outbox.put_batch(
                lambda seq: Batch(
                    engine_id=self.engine_id, epoch=self.epoch, seq=seq, ts=ts, events=events
                )
            ):
                return
            log.log(
                logging.WARNING if self.outbox.overflowed() else logging.DEBUG,
                "event outbox full (%d batches, %d bytes unacknowledged): replacing the batches "
                "with a snapshot that carries their finished requests",
                self.outbox.num_buffered,
                self.outbox.num_buffered_bytes,
            )
            self.enqueue_snapshot(engine)
        except Exception:
            self.outbox.ask_snapshot()  # events may be lost: the next call sends the table
            log.exception("event publisher failed to batch a step's events")

    def enqueue_snapshot(self, engine: Engine) -> None:
        """Replace every unacknowledged frame with the block table (on the engine thread); the
        finished requests of the frames it replaces ride along."""
        pins = [pin.event() for pin in engine.pins.values()]
        put_snapshot(self.outbox, self.engine_id, self.epoch, engine.snapshot()["blocks"], pins)

    def _command(self, command: Command) -> None:
        if self.on_command is None:
            log.warning("no handler for the control plane's %s command", command.command)
            return
        self.on_command(command)

    # ------------------------------------------------------------------ caller side
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the store has acknowledged every frame; False on timeout.

        Call it from the thread that steps the engine, or while the engine is idle: it batches
        events still in the sink, and builds a snapshot here if the store asks for one.
        """
        if self.engine is None:
            return True
        deadline = time.monotonic() + timeout_s
        outbox = self.outbox
        while True:
            self.on_step(self.engine)  # events still in the sink, or the snapshot asked for
            with outbox.cond:
                while outbox.num_buffered and not outbox.needs_snapshot and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    outbox.cond.wait(min(left, 0.5))
                if not outbox.num_buffered and not outbox.needs_snapshot:
                    return True
                if self.closed or time.monotonic() >= deadline:
                    return False
                outbox.cond.wait(0.05)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the background threads and detach from the engine. Idempotent."""
        self.closed = True
        if self.engine is not None and self.on_step in self.engine.step_listeners:
            self.engine.step_listeners.remove(self.on_step)
        if self.link is not None:
            self.link.stop(timeout_s)

    def stats(self) -> PublisherStats:
        outbox, link = self.outbox, self.link
        with outbox.cond:
            return PublisherStats(
                num_sent=outbox.num_sent,
                num_resent=outbox.num_resent,
                num_acked=outbox.num_acked,
                num_dropped=outbox.num_dropped,
                num_snapshots=outbox.num_snapshots,
                num_buffered=outbox.num_buffered,
                num_buffered_bytes=outbox.num_buffered_bytes,
                num_requests_waiting=outbox.num_requests_waiting,
                num_requests_dropped=outbox.num_requests_dropped,
                last_drop=outbox.last_drop,
                num_connections=link.num_connections if link else 0,
                is_connected=link.is_connected if link else False,
                last_error=link.last_error if link else None,
            )

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
