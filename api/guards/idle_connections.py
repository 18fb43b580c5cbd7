"""Idle sockets cannot keep requests out: `GuardedProtocol`, the protocol `junction api` serves.

uvicorn's `limit_concurrency` counts every open connection, so a client that held 1,000
sockets without sending a byte (and reopened them after each header timeout) kept every
request at 503 while engines' websockets still got in. `junction api` does not use it. Instead
`GuardedProtocol` (`HeaderTimeoutProtocol` with these bounds) keeps the connections that wait
for a request in a `WaitingRoom` (`api.guards.waiting_room`) and bounds them itself:

- `JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP` and `JUNCTION_MAX_IDLE_CONNECTIONS`: waiting
  connections of one client IP, and of all; one more closes the oldest waiting one of that IP,
  else of the IP holding the most, answered 503 naming the setting.
- `JUNCTION_MAX_CONNECTIONS`: every connection at once (waiting, serving a request, engines'
  websockets). A new one over it closes a waiting one (the same choice) to take its place;
  only when none waits (all serve requests or websockets), or requests in progress reach the
  bound, is the new connection answered 503 and closed at once.

So a client that sends its request as it connects gets in while any connection merely waits:
the idle ones are what gives way, another client's flood first (a client sharing the flood's
IP, behind one NAT, shares its idle bound too; a proxy in front, such as compose's HAProxy,
opens a connection only with a whole request to send). Each bound is read from
`get_settings()`, as uvicorn builds the protocol from its own config
(`uvicorn.run(http="api.guards.idle_connections:GuardedProtocol")`).
"""

from __future__ import annotations

import asyncio
from typing import Any
from weakref import WeakKeyDictionary

import h11
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from api.guards.header_timeout import HeaderTimeoutProtocol
from api.guards.waiting_room import WaitingRoom
from api.settings import Settings, get_settings

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


def room_of(server_state: ServerState, settings: Settings) -> WaitingRoom[GuardedProtocol]:
    room = _rooms.get(server_state)
    if room is None:
        per_ip = settings.max_idle_connections_per_ip
        room = _rooms[server_state] = WaitingRoom(settings.max_idle_connections, per_ip)
    return room


class GuardedProtocol(HeaderTimeoutProtocol):
    """uvicorn's h11 protocol with the header timeout and the bounds of the module's
    docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.max_connections = settings.max_connections
        self.room = room_of(self.server_state, settings)
        self.peer = ""  # the client's IP ("" when the transport has none: a unix socket)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        client = get_remote_addr(transport)
        self.peer = client[0] if client else ""
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
        victim = self.room.victim()
        if victim is None:
            return (
                f"{len(self.connections)} connections, each serving a request or a websocket "
                "(JUNCTION_MAX_CONNECTIONS)"
            )
        victim.close_waiting("JUNCTION_MAX_CONNECTIONS")
        return None

    def _track_waiting(self) -> None:
        """A connection waits while h11 sees its client between requests (IDLE: no request
        head yet, or the last response sent on keep-alive); it keeps its place in the room as
        a head's first bytes trickle in (the header timeout bounds that)."""
        is_waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not is_waiting:
            self.room.leave(self)
        elif self not in self.room:
            for evicted in self.room.enter(self, self.peer):
                evicted.connection.close_waiting(evicted.setting)
