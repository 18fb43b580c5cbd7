"""The engines connected to this control plane, and the way commands reach them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import WebSocket
from pydantic import BaseModel

from engine.wire import Command, encode


class EngineNotConnected(LookupError):
    def __init__(self, engine_id: str) -> None:
        super().__init__(f"engine {engine_id!r} is not connected")
        self.engine_id = engine_id


@dataclass(eq=False)
class Connection:
    """One engine's socket; frames go out in the encoding the engine's hello came in."""

    engine_id: str
    epoch: int
    websocket: WebSocket
    is_binary: bool
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, frame: BaseModel) -> None:
        async with self.lock:  # acks and commands come from different tasks
            if self.is_binary:
                await self.websocket.send_bytes(encode(frame, binary=True))
            else:
                await self.websocket.send_text(encode(frame))


class EngineRegistry:
    """At most one live connection per engine id: the newest hello wins."""

    def __init__(self) -> None:
        self._connections: dict[str, Connection] = {}

    def __len__(self) -> int:
        return len(self._connections)

    def __contains__(self, engine_id: str) -> bool:
        return engine_id in self._connections

    def add(self, connection: Connection) -> None:
        self._connections[connection.engine_id] = connection

    def remove(self, connection: Connection) -> bool:
        """Forget `connection`; False when a newer connection of its engine took its place."""
        if self._connections.get(connection.engine_id) is not connection:
            return False
        del self._connections[connection.engine_id]
        return True

    def engine_ids(self) -> list[str]:
        return sorted(self._connections)

    async def send_command(self, engine_id: str, command: Command) -> None:
        """Send a pin/unpin command down `engine_id`'s socket; raises `EngineNotConnected`."""
        connection = self._connections.get(engine_id)
        if connection is None:
            raise EngineNotConnected(engine_id)
        await connection.send(command)
