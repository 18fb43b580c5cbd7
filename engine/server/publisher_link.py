"""`PublisherLink`: the publisher's side of the ingest socket, on threads of its own.

One sender thread connects, says hello, takes the welcome's `next_seq` (frames below it are
already stored), sends the buffer from there in seq order and then each new frame as the engine
thread appends it. A reader thread per connection takes cumulative acks (dropping every frame up
to the seq) and commands. Any error or close ends the connection; the sender waits a backoff
(0.1 s doubling to 5 s, jittered; 30 s after the control plane refused the token) and connects
again. A gap the buffer cannot fill (the store lost frames we dropped, or said 4422) asks the
engine thread for a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from engine.wire import (
    CLOSE_BAD_FRAME,
    CLOSE_FUTURE_SEQ,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    CLOSE_WRONG_ENGINE,
    Ack,
    Command,
    Welcome,
    WireError,
    decode,
    encode,
)

if TYPE_CHECKING:
    from engine.server.publisher import EventPublisher, OutFrame

log = logging.getLogger("engine.server.publisher")

INGEST_PATH = "/api/v1/ingest"
_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}


def ingest_url(base: str) -> str:
    """`http://host:port[/prefix]` (or ws/https/wss) -> `ws://host:port[/prefix]/api/v1/ingest`."""
    parts = urlsplit(base.strip())
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise ValueError(f"control plane URL must be http(s):// or ws(s)://host, got {base!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(INGEST_PATH):
        path += INGEST_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.1
    max_s: float = 5.0
    unauthorized_s: float = 30.0  # a refused token waits for the operator: retry slowly

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * 2 ** min(attempt, 30))
        return base * random.uniform(0.5, 1.0)


_ASK_SNAPSHOT = object()


class _Refused(Exception):
    """The control plane refused the token (close 4401 or HTTP 401/403)."""


@dataclass
class _Connection:
    ws: ClientConnection
    closed: bool = False  # set by the reader when the socket is done
    asked_snapshot: bool = False


class PublisherLink:
    def __init__(self, publisher: EventPublisher) -> None:
        self.pub = publisher
        self.cond = publisher.cond
        self.send_seq = 0  # the seq the store expects next on this connection
        self.stopping = threading.Event()
        self.current: _Connection | None = None
        self.last_logged: str | None = None
        self.thread = threading.Thread(target=self._run, name="event-publisher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
            current = self.current
        if current is not None:
            current.ws.close()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    # ------------------------------------------------------------------ sender thread
    def _run(self) -> None:
        attempt = 0
        while not self.stopping.is_set():
            refused = welcomed = False
            try:
                welcomed = self._session()
            except _Refused as exc:
                refused = True
                self._error(str(exc), logging.ERROR)
            except Exception as exc:  # never let the thread die: log, back off, reconnect
                self._error(f"{type(exc).__name__}: {exc}", logging.WARNING)
            with self.cond:
                self.pub.is_connected = False
                self.current = None
            if welcomed:
                attempt = 0
            delay = self.pub.backoff.unauthorized_s if refused else self.pub.backoff.delay(attempt)
            attempt += 1
            self.stopping.wait(delay)

    def _session(self) -> bool:
        """One connection, until it closes; True when it got as far as a welcome."""
        pub = self.pub
        try:
            ws = connect(
                pub.url,
                additional_headers={"Authorization": f"Bearer {pub.token}"},
                max_size=pub.max_frame_bytes,
                open_timeout=pub.open_timeout_s,
                close_timeout=1.0,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise _Refused(f"control plane refused the token (HTTP {status})") from exc
            raise
        with ws:  # closes the socket however the connection ends
            conn = _Connection(ws)
            with self.cond:
                self.current = conn
            reader: threading.Thread | None = None
            try:
                if self.stopping.is_set():
                    return False
                ws.send(encode(pub.hello, pub.binary))
                welcome = decode(ws.recv(timeout=pub.open_timeout_s), pub.max_frame_bytes)
                if not isinstance(welcome, Welcome):
                    raise WireError(CLOSE_BAD_FRAME, f"expected a welcome, got {welcome.type!r}")
                self._welcome(welcome)
                reader = threading.Thread(
                    target=self._read, args=(conn,), name="event-publisher-reader", daemon=True
                )
                reader.start()
                self._stream(conn)
            except ConnectionClosed:
                pass  # the close code, read below, says why
            finally:
                ws.close()
                if reader is not None:
                    reader.join(5.0)
        if not self.stopping.is_set():
            self._closed(ws.close_code, ws.close_reason)
        return reader is not None

    def _welcome(self, welcome: Welcome) -> None:
        pub = self.pub
        with self.cond:
            if welcome.epoch != pub.epoch:
                log.warning("welcome for epoch %d, ours is %d", welcome.epoch, pub.epoch)
            if welcome.next_seq > pub.next_seq:  # a store ahead of us: only a snapshot can help
                log.warning("the store wants seq %d, ours is %d", welcome.next_seq, pub.next_seq)
                pub.seq_floor = welcome.next_seq
                pub.needs_snapshot = True
            while pub.buffer and pub.buffer[0].seq < welcome.next_seq:
                pub.buffer.popleft()
                pub.counts["acked"] += 1
            self.send_seq = welcome.next_seq
            self.last_logged = None
            pub.is_overflowing = False
            pub.is_connected = True
            pub.counts["connections"] += 1
            self.cond.notify_all()
        log.info("connected to %s; the store wants seq %d", pub.url, welcome.next_seq)

    def _stream(self, conn: _Connection) -> None:
        while True:
            with self.cond:
                frame = self._take_frame(conn)
            if frame is None:
                return
            if frame is _ASK_SNAPSHOT:
                conn.asked_snapshot = True
                self._ask_snapshot()
                continue
            if frame.payload is None:
                frame.payload, frame.body = encode(frame.body, self.pub.binary), None
            if len(frame.payload) > self.pub.max_frame_bytes:
                log.error("frame seq %d is %d bytes: over the limit", frame.seq, len(frame.payload))
            conn.ws.send(frame.payload)

    def _take_frame(self, conn: _Connection) -> OutFrame | object | None:
        """Wait for the next frame to send and count it sent (under `cond`); `_ASK_SNAPSHOT`
        when the engine thread should build a snapshot now; None when the connection ends."""
        pub = self.pub
        while not (self.stopping.is_set() or conn.closed):
            frame = self._next_frame()
            if frame is not None:
                self.send_seq = frame.seq + 1  # before it goes: its ack may beat `send` returning
                pub.counts["sent"] += 1
                pub.counts["resent"] += frame.was_sent
                pub.counts["snapshots"] += frame.is_snapshot
                frame.was_sent = True
                return frame
            if self._has_gap() and not pub.needs_snapshot:
                log.warning("the store wants seq %d, no longer buffered", self.send_seq)
                pub.needs_snapshot = True
                self.cond.notify_all()  # a flush waiting on the engine thread builds it
            if pub.needs_snapshot and pub.call_on_engine and not conn.asked_snapshot:
                return _ASK_SNAPSHOT
            self.cond.wait(1.0)
        return None

    def _next_frame(self) -> OutFrame | None:
        """The frame to send now: seq `send_seq`, or a snapshot past it (under `cond`)."""
        buffer = self.pub.buffer
        if not buffer:
            return None
        index = max(0, self.send_seq - buffer[0].seq)  # the buffer holds consecutive seqs
        if index >= len(buffer):
            return None
        frame = buffer[index]
        return frame if frame.seq == self.send_seq or frame.is_snapshot else None

    def _has_gap(self) -> bool:
        """The store wants a seq that is neither buffered nor yet to come (under `cond`)."""
        buffer, pub = self.pub.buffer, self.pub
        if buffer:
            return buffer[0].seq > self.send_seq and not buffer[0].is_snapshot
        return self.send_seq < pub.next_seq

    def _ask_snapshot(self) -> None:
        """Have the engine thread build the snapshot now, even if it is idle."""
        call = self.pub.call_on_engine
        try:
            result = call(self.pub.on_step)
            if asyncio.iscoroutine(result):
                asyncio.run(result)
        except Exception as exc:
            log.info("could not ask the engine for a snapshot now (%s); it comes after a step", exc)

    # ------------------------------------------------------------------ reader thread
    def _read(self, conn: _Connection) -> None:
        try:
            for data in conn.ws:
                self._receive(data)
        except ConnectionClosed:
            pass  # the sender reads the close code
        except Exception as exc:
            self._error(f"reader failed: {type(exc).__name__}: {exc}", logging.WARNING)
        finally:
            with self.cond:
                conn.closed = True
                self.cond.notify_all()

    def _receive(self, data: str | bytes) -> None:
        pub = self.pub
        try:
            frame = decode(data, pub.max_frame_bytes)
        except WireError as exc:
            log.warning("ignoring a bad frame from the control plane: %s", exc.reason)
            return
        if isinstance(frame, Ack):
            with self.cond:
                upto = min(frame.seq, self.send_seq - 1)  # never drop what was not sent
                while pub.buffer and pub.buffer[0].seq <= upto:
                    pub.buffer.popleft()
                    pub.counts["acked"] += 1
                self.cond.notify_all()
        elif isinstance(frame, Command):
            if pub.on_command is None:
                log.warning("no handler for the control plane's %s command", frame.command)
                return
            try:
                pub.on_command(frame)
            except Exception:
                log.exception("command handler failed on %s", frame.command)
        else:
            log.warning("ignoring an unexpected %s frame from the control plane", frame.type)

    # ------------------------------------------------------------------ errors
    def _closed(self, code: int | None, reason: str | None) -> None:
        where = f"close {code}{f' ({reason})' if reason else ''}"
        if code == CLOSE_UNAUTHORIZED:
            raise _Refused(f"control plane refused the token ({where})")
        if code == CLOSE_FUTURE_SEQ:
            with self.cond:
                self.pub.needs_snapshot = True
            self._error(f"the store has a gap ({where}): sending a snapshot", logging.WARNING)
        elif code in (CLOSE_BAD_FRAME, CLOSE_WRONG_ENGINE, CLOSE_TOO_BIG):
            self._error(f"control plane rejected a frame ({where})", logging.ERROR)
        elif code == 1006:
            self._error("connection to the control plane lost", logging.WARNING)
        elif code == CLOSE_TRY_AGAIN:
            self._error(
                f"the control plane's store is unavailable ({where}): buffering, retrying",
                logging.WARNING,
            )
        else:
            self._error(f"control plane closed the connection ({where})", logging.WARNING)

    def _error(self, message: str, level: int) -> None:
        """Record `message`; log it at `level` unless it repeats the last one (a long outage)."""
        with self.cond:
            self.pub.last_error = message
        repeated, self.last_logged = message == self.last_logged, message
        log.log(logging.DEBUG if repeated else level, "event publisher: %s", message)
