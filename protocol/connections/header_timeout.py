"""A read timeout for a request's headers, which uvicorn does not have.

uvicorn times only an idle keep-alive connection (`timeout_keep_alive`: from the end of a
response to the first byte of the next request). A connection that sends nothing once open, or
trickles its headers a byte at a time, is kept for good: a slowloris (20,000 such connections,
in the issue, were never closed). `HeaderTimeoutProtocol` is uvicorn's h11 protocol with one
timer more, armed while the connection waits for a request's headers (from the moment it
opens, and from the first byte of each later request) and disarmed once they are complete;
when it fires, the connection is answered 408 and closed. The body's own timeout is the
app's (`api.guards.limits` in `junction api`).

Servers serve its subclass, `protocol.connections.guarded.GuardedProtocol` (which adds the
bounds on idle connections); uvicorn builds it with its own arguments, so the timeout is the
class's `bounds` (`JUNCTION_HEADER_TIMEOUT_S` in each server).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from protocol.connections.bounds import ConnectionBounds

MESSAGE = b"the request's headers did not come in time (JUNCTION_HEADER_TIMEOUT_S)\n"
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(MESSAGE), MESSAGE)
)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that takes more than `header_timeout_s`
    to send a request's headers (`bounds.header_timeout_s`)."""

    bounds = ConnectionBounds()  # a server's subclass sets its own

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = self.bounds.header_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._time_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._time_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _time_headers(self) -> None:
        """h11 is IDLE on the client's side until a request's headers are complete (then it
        is in the body, done, or switching to a websocket)."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._stop_timer()
        elif self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _stop_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _timed_out(self) -> None:
        self.header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closed a connection whose request headers did not come in time")
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()
