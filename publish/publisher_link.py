"""`PublisherLink`: the publisher's side of the ingest socket, on threads of its own.

One sender thread connects, says hello, takes the welcome's `next_seq` (frames below it are
already stored), sends the outbox's frames from there in seq order and then each new frame as
the engine thread puts it (`Outbox.take`). A reader thread per connection hands cumulative acks
to the outbox (`Outbox.ack`, dropping every frame up to the seq) and commands to `on_command`.
Any error or close ends the connection; the sender waits a backoff (0.1 s doubling to 5 s,
jittered, reset once a session gets a frame acknowledged; 30 s after the control plane refused
the token) and connects again. A gap the outbox cannot fill (the store lost frames we dropped,
or said 4422) asks the engine thread for a snapshot (`build_snapshot`).

A frame the control plane refuses (4400 a bad frame, 1009 too big, 1011 it failed on it) is
not sent forever (a 1011 for a keepalive ping that went unanswered refuses nothing): the
sessions stuck at one seq back off like any failure, and after `outbox.MAX_REJECTIONS` of
them the outbox drops that frame, counts its requests lost, and the error says which frame it
was (`PublisherStats.last_error`). A hello refused (4409: an epoch the store will not take;
4411: another engine process holds our engine id) is logged as an error with its reason and
retried with backoff like any failure; the outbox keeps what the engine finished, bounded.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from engine.wire import (
    CLOSE_BAD_FRAME,
    CLOSE_FUTURE_SEQ,
    CLOSE_ID_TAKEN,
    CLOSE_STOPPING,
    CLOSE_SUPERSEDED,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    CLOSE_WRONG_ENGINE,
    Ack,
    Command,
    Hello,
    Welcome,
    WireError,
    decode,
    encode,
)
from publish.outbox import ASK_SNAPSHOT, MAX_REJECTIONS, Outbox

log = logging.getLogger("publish.publisher")

CLOSE_INTERNAL_ERROR = 1011  # the control plane failed on what we sent
KEEPALIVE_TIMEOUT = "keepalive ping timeout"  # the reason of websockets' 1011 for a lost pong

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


class _Refused(Exception):
    """The control plane refused the token (close 4401 or HTTP 401/403)."""


@dataclass
class _Connection:
    ws: ClientConnection
    closed: bool = False  # set by the reader when the socket is done
    asked_snapshot: bool = False


class PublisherLink:
    """Streams `outbox` to `url` until stopped. `build_snapshot()` has the engine thread put a
    snapshot now (it may return a coroutine to run); without it one comes after a step."""

    def __init__(
        self,
        outbox: Outbox,
        url: str,
        token: str,
        hello: Hello,
        *,
        binary: bool,
        backoff: Backoff,
        open_timeout_s: float,
        max_frame_bytes: int,
        on_command: Callable[[Command], None],
        build_snapshot: Callable[[], Any] | None = None,
    ) -> None:
        self.outbox = outbox
        self.cond = outbox.cond  # also guards the status below, read with the outbox's counts
        self.url, self.token, self.hello = url, token, hello
        self.binary = binary
        self.backoff = backoff
        self.open_timeout_s = open_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.on_command = on_command
        self.build_snapshot = build_snapshot
        self.is_connected = False
        self.num_connections = 0  # connections that got as far as a welcome
        self.last_error: str | None = None
        self.session_seq: int | None = None  # the seq the store wanted at this session's welcome
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
        if current is not None:  # the lease on the engine id ends with this goodbye
            current.ws.close(CLOSE_STOPPING, "engine stopping")
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    # ------------------------------------------------------------------ sender thread
    def _run(self) -> None:
        attempt = 0
        while not self.stopping.is_set():
            refused = False
            num_acked = self.outbox.num_acked
            try:
                self._session()
            except _Refused as exc:
                refused = True
                self._error(str(exc), logging.ERROR)
            except Exception as exc:  # never let the thread die: log, back off, reconnect
                self._error(f"{type(exc).__name__}: {exc}", logging.WARNING)
            with self.cond:
                self.is_connected = False
                self.current = None
            self.outbox.disconnected()
            if self.outbox.num_acked > num_acked:  # the session made progress
                attempt = 0
            delay = self.backoff.unauthorized_s if refused else self.backoff.delay(attempt)
            attempt += 1
            self.stopping.wait(delay)

    def _session(self) -> bool:
        """One connection, until it closes; True when it got as far as a welcome."""
        self.session_seq = None
        try:
            ws = connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                max_size=self.max_frame_bytes,
                open_timeout=self.open_timeout_s,
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
                ws.send(encode(self.hello, self.binary))
                welcome = decode(ws.recv(timeout=self.open_timeout_s), self.max_frame_bytes)
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
        if welcome.epoch != self.hello.epoch:
            log.warning("welcome for epoch %d, ours is %d", welcome.epoch, self.hello.epoch)
        with self.cond:
            self.session_seq = welcome.next_seq
            if self.outbox.welcome(welcome.next_seq):
                ours = self.outbox.next_seq
                log.warning("the store wants seq %d, ours is %d", welcome.next_seq, ours)
            self.last_logged = None
            self.is_connected = True
            self.num_connections += 1
        log.info("connected to %s; the store wants seq %d", self.url, welcome.next_seq)

    def _stream(self, conn: _Connection) -> None:
        while True:
            may_ask = self.build_snapshot is not None and not conn.asked_snapshot
            frame = self.outbox.take(lambda: self.stopping.is_set() or conn.closed, may_ask)
            if frame is None:
                return
            if frame is ASK_SNAPSHOT:
                conn.asked_snapshot = True
                self._ask_snapshot()
                continue
            for payload in frame.encoded(self.binary, self.max_frame_bytes):
                conn.ws.send(payload)

    def _ask_snapshot(self) -> None:
        """Have the engine thread build the snapshot now, even if it is idle."""
        try:
            result = self.build_snapshot()
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
        try:
            frame = decode(data, self.max_frame_bytes)
        except WireError as exc:
            log.warning("ignoring a bad frame from the control plane: %s", exc.reason)
            return
        if isinstance(frame, Ack):
            self.outbox.ack(frame.seq)
        elif isinstance(frame, Command):
            try:
                self.on_command(frame)
            except Exception:
                log.exception("command handler failed on %s", frame.command)
        else:
            log.warning("ignoring an unexpected %s frame from the control plane", frame.type)

    # ------------------------------------------------------------------ errors
    def _closed(self, code: int | None, reason: str | None) -> None:
        where = f"close {code}{f' ({reason})' if reason else ''}"
        if code == CLOSE_INTERNAL_ERROR and reason == KEEPALIVE_TIMEOUT:
            # the control plane's keepalive ping went unanswered: the line failed, not a frame
            # (ours failing closes without waiting for the echo: 1006)
            self._error(f"connection to the control plane lost ({where})", logging.WARNING)
            return
        if code == CLOSE_UNAUTHORIZED:
            raise _Refused(f"control plane refused the token ({where})")
        if code == CLOSE_FUTURE_SEQ:
            self.outbox.ask_snapshot()
            self._error(f"the store has a gap ({where}): sending a snapshot", logging.WARNING)
        elif code in (CLOSE_BAD_FRAME, CLOSE_TOO_BIG, CLOSE_INTERNAL_ERROR):
            dropped = None if self.session_seq is None else self.outbox.rejected(self.session_seq)
            if dropped is None:
                self._error(f"control plane rejected a frame ({where})", logging.ERROR)
            else:
                self._error(
                    f"control plane rejected a frame ({where}) {MAX_REJECTIONS} times: "
                    f"dropped {dropped} and resending the table",
                    logging.ERROR,
                )
        elif code in (CLOSE_WRONG_ENGINE, CLOSE_ID_TAKEN):
            self._error(
                f"control plane refused this engine ({where}); its finished requests stay "
                "in the outbox, retrying",
                logging.ERROR,
            )
        elif code == CLOSE_SUPERSEDED:
            self._error(
                f"a newer connection of this engine took over ({where}): reconnecting",
                logging.WARNING,
            )
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
            self.last_error = message
        repeated, self.last_logged = message == self.last_logged, message
        log.log(logging.DEBUG if repeated else level, "event publisher: %s", message)
