"""The engines whose sockets this replica holds, and the way commands reach them.

Fleet-wide, the store says which replica holds each engine (`api.fleet.replicas`); this is the
replica's own part: at most one live connection per engine id, the newest hello winning (the
one it replaces is handed back, for the caller to close)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import WebSocket
from pydantic import BaseModel

from api.fleet.replicas import new_connection_id
from engine.wire import Command, encode

MAX_REASON_BYTES = 123  # a close frame's reason must fit in 125 bytes with its code


class EngineNotConnected(LookupError):
    def __init__(self, engine_id: str) -> None:
        super().__init__(f"engine {engine_id!r} is not connected")
        self.engine_id = engine_id


@dataclass(eq=False)
class Connection:
    """One engine's socket; frames go out in the encoding the engine's hello came in.
    `connection_id` names it in the store (`engines.connection_id`)."""

    engine_id: str
    epoch: int
    websocket: WebSocket
    is_binary: bool
    connection_id: str = field(default_factory=new_connection_id)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, frame: BaseModel) -> None:
        async with self.lock:  # acks and commands come from different tasks
            if self.is_binary:
                await self.websocket.send_bytes(encode(frame, binary=True))
            else:
                await self.websocket.send_text(encode(frame))

    async def close(self, code: int, reason: str) -> None:
        """Close the socket with `code` and `reason` (cut to fit a close frame); a socket the
        peer already left is left alone."""
        await close_websocket(self.websocket, code, reason)


async def close_websocket(websocket: WebSocket, code: int, reason: str) -> None:
    reason = reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")
    try:
        await websocket.close(code, reason)
    except RuntimeError:  # the peer went away first, or the socket is closed already
        pass


class EngineRegistry:
    """At most one live connection per engine id: the newest hello wins."""

    def __init__(self) -> None:
        self._connections: dict[str, Connection] = {}
        # sockets whose hello is being applied: the store may already name them as the
        # engine's holder, so the heartbeat must not take them for lost (`connection_ids`)
        self._opening: set[str] = set()

    def __len__(self) -> int:
        return len(self._connections)

    def __contains__(self, engine_id: str) -> bool:
        return engine_id in self._connections

    def get(self, engine_id: str) -> Connection | None:
        return self._connections.get(engine_id)

    def add(self, connection: Connection) -> Connection | None:
        """Hold `connection`; returns the older connection of its engine it replaces, if any."""
        older = self._connections.get(connection.engine_id)
        self._connections[connection.engine_id] = connection
        return older

    def remove(self, connection: Connection) -> bool:
        """Forget `connection`; False when a newer connection of its engine took its place."""
        if self._connections.get(connection.engine_id) is not connection:
            return False
        del self._connections[connection.engine_id]
        return True

    def opening(self, connection_id: str) -> None:
        """A socket's hello is about to be applied under `connection_id`."""
        self._opening.add(connection_id)

    def opened(self, connection_id: str) -> None:
        """Its hello was applied (and the connection added) or refused."""
        self._opening.discard(connection_id)

    def connection_ids(self) -> list[str]:
        """The ids of the sockets held, and of those whose hello is being applied."""
        return [c.connection_id for c in self._connections.values()] + list(self._opening)

    def engine_ids(self) -> list[str]:
        return sorted(self._connections)

    def connections(self) -> list[Connection]:
        return list(self._connections.values())

    async def send_command(self, engine_id: str, command: Command) -> None:
        """Send a pin/unpin command down `engine_id`'s socket; raises `EngineNotConnected`."""
        connection = self._connections.get(engine_id)
        if connection is None:
            raise EngineNotConnected(engine_id)
        await connection.send(command)
