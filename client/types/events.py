"""What the store kept of an engine's stream: its event batches (`GET /events`) and the frames
it refused (`GET /engines/{id}/dead-letters`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from client.types.base import Body


class BatchOut(Body):
    engine_id: str
    epoch: int
    seq: int
    ts: float
    received_at: datetime
    num_events: int
    events: list[dict[str, Any]]  # each event as `engine.events` writes it, tagged by `type`


class EventPage(Body):
    """Batches with `seq > after_seq`; `next_after_seq` is the last seq returned."""

    engine_id: str | None
    epoch: int | None
    after_seq: int
    limit: int
    next_after_seq: int
    batches: list[BatchOut]


class DeadLetterOut(Body):
    """A frame the store refused: `frame` its JSON, cut; `frame_bytes` its whole length."""

    id: int
    engine_id: str
    epoch: int
    seq: int
    frame_type: str
    received_at: datetime
    reason: str
    frame: str
    frame_bytes: int


class DeadLetterPage(Body):
    engine_id: str
    total: int
    offset: int
    limit: int
    dead_letters: list[DeadLetterOut]
