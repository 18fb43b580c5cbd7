"""Idle sockets cannot keep requests out: `GuardedProtocol`, the protocol Junction's servers serve.

uvicorn's `limit_concurrency` counts every open connection, so a client that held 1,000
sockets without sending a byte (and reopened them after each header timeout) kept every
request at 503 while engines' websockets still got in; with no bound at all, the same sockets
use up the open-file limit and accept() fails for everyone. `GuardedProtocol`
(`HeaderTimeoutProtocol` with these bounds) keeps the connections that wait for a request in a
`WaitingRoom` (`protocol.connections.waiting_room`) and bounds them itself:

- `JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP` and `JUNCTION_MAX_IDLE_CONNECTIONS`: waiting
  connections of one client IP, and of all; one more closes the oldest waiting one of that IP,
  else of the IP holding the most, answered 503 naming the setting.
- `JUNCTION_MAX_CONNECTIONS` (lowered to what `ulimit -n` leaves): every connection at once
  (waiting, serving a request, websockets). A new one over it closes a waiting one (the same
  choice) to take its place; only when none waits (all serve requests or websockets), or
  requests in progress reach the bound, is the new connection answered 503 and closed at once.

A connection whose bytes already wait unread in its socket is never the one closed: it has
spoken, and asyncio reads it next (a client reconnecting idle sockets from the same IP as a
legitimate one, faster than the server reads, pushed the legitimate connection out of the
room in the very burst it was accepted in: issue 47, item 6). It leaves the room instead, and
the next oldest gives way. One pushed out of the room by its IP's bound within `GRACE_S` of
opening is closed only at `GRACE_S` if it has still said nothing: a client between its
connect and its first write is not taken for the flood around it (the flood's sockets, out of
the room, are held that much longer, within `JUNCTION_MAX_CONNECTIONS`).

So a client that sends its request as it connects gets in while any connection merely
waits, whatever IP the flood comes from. Each server sets the class's `bounds`:
`guarded_protocol(bounds)` makes the class uvicorn builds (`http=` in its config).
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from typing import Any
from weakref import WeakKeyDictionary

import h11
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from protocol.connections.bounds import ConnectionBounds
from protocol.connections.header_timeout import HeaderTimeoutProtocol
from protocol.connections.waiting_room import WaitingRoom

#: how long a new connection pushed out by its IP's bound has to start its request
GRACE_S = 0.25

# one room per server (tests run several in one process), made by its first connection
_rooms: WeakKeyDictionary[ServerState, WaitingRoom[GuardedProtocol]] = WeakKeyDictionary()


def busy_response(why: str) -> bytes:
    """A 503 that closes the connection, saying `why` (it names the setting)."""
    message = f"{why}; retry shortly\n".encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
        % (len(message), message)
    )


WHY_WAITING = {
    "JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP": "closed: this client holds too many connections "
    "that sent no request (JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP)",
    "JUNCTION_MAX_IDLE_CONNECTIONS": "closed: too many connections sent no request "
    "(JUNCTION_MAX_IDLE_CONNECTIONS)",
    "JUNCTION_MAX_CONNECTIONS": "closed to make room for a new connection: the server holds "
    "JUNCTION_MAX_CONNECTIONS connections",
}


def room_of(server_state: ServerState, bounds: ConnectionBounds) -> WaitingRoom[GuardedProtocol]:
    room = _rooms.get(server_state)
    if room is None:
        room = _rooms[server_state] = WaitingRoom(bounds.max_idle, bounds.max_idle_per_ip)
    return room


def guarded_protocol(bounds: ConnectionBounds) -> type[GuardedProtocol]:
    """The protocol class a server passes uvicorn (`http=`), bounded by `bounds` (lowered to
    the open-file limit)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"bounds": bounds.within_open_files()})


def num_unread(transport: asyncio.BaseTransport) -> int:
    """Bytes the client sent that wait in the socket, not yet read (0 when unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, ValueError):
        return 0


class GuardedProtocol(HeaderTimeoutProtocol):
    """uvicorn's h11 protocol with the header timeout and the bounds of the module's
    docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = self.bounds.max_connections
        self.room = room_of(self.server_state, self.bounds)
        self.peer = ""  # the client's IP ("" when the transport has none: a unix socket)
        self.opened_at = 0.0  # the loop's time at connection_made

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        client = get_remote_addr(transport)
        self.peer = client[0] if client else ""
        self.opened_at = self.loop.time()
        refusal = self._make_room()  # before uvicorn counts this connection
        super().connection_made(transport)
        if refusal is not None:
            self.logger.warning("refused a connection: %s", refusal)
            self.connections.discard(self)  # counted no more: it is on its way out
            self.transport.write(busy_response(refusal))
            self.transport.close()
            return
        self._track_waiting()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track_waiting()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self.room.leave(self)
        super().connection_lost(exc)

    def has_spoken(self) -> bool:
        """Whether its client's bytes wait unread: it is about to be read, not idle."""
        return not self.transport.is_closing() and num_unread(self.transport) > 0

    def give_way(self, setting: str) -> None:
        """Pushed out of the room by `setting`: closed, unless it has spoken meanwhile (then
        it stays open, out of the room, and its request is read next), or it opened less than
        `GRACE_S` ago (then it is closed at `GRACE_S` if still silent)."""
        if self.has_spoken():
            self.logger.debug("kept a connection whose request waits to be read")
            return
        left_s = self.opened_at + GRACE_S - self.loop.time()
        if left_s > 0:
            self.loop.call_later(left_s, self._close_if_silent, setting)
            return
        self.close_waiting(setting)

    def _close_if_silent(self, setting: str) -> None:
        """The end of a grace: closed if it has sent nothing and is not back in the room."""
        if self.transport.is_closing() or self in self.room or self.has_spoken():
            return
        if self.conn.their_state is h11.IDLE:
            self.close_waiting(setting)

    def close_waiting(self, setting: str) -> None:
        """Close this connection, which waits for a request, to make room."""
        self.room.leave(self)
        self.connections.discard(self)  # its place is free now, not once the close is done
        if not self.transport.is_closing():
            self.logger.info("closed a connection that sent no request (%s)", setting)
            self.transport.write(busy_response(WHY_WAITING[setting]))
            self.transport.close()

    def _make_room(self) -> str | None:
        """Under `max_connections`, or having closed a waiting connection to get there: None.
        Else why the new connection is refused."""
        if len(self.tasks) >= self.max_connections:
            return f"{len(self.tasks)} requests in progress (JUNCTION_MAX_CONNECTIONS)"
        if len(self.connections) < self.max_connections:
            return None
        while (victim := self.room.victim()) is not None:
            if victim.has_spoken():  # not idle: out of the room, and the next oldest goes
                self.room.leave(victim)
                continue
            victim.close_waiting("JUNCTION_MAX_CONNECTIONS")
            return None
        return (
            f"{len(self.connections)} connections, each serving a request or a websocket "
            "(JUNCTION_MAX_CONNECTIONS)"
        )

    def _track_waiting(self) -> None:
        """A connection waits while h11 sees its client between requests (IDLE: no request
        head yet, or the last response sent on keep-alive); it keeps its place in the room as
        a head's first bytes trickle in (the header timeout bounds that)."""
        is_waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not is_waiting:
            self.room.leave(self)
        elif self not in self.room:
            for evicted in self.room.enter(self, self.peer):
                evicted.connection.give_way(evicted.setting)
