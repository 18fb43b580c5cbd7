"""A pin as its events and snapshots carry it: its boundary, key, state and blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from engine.events import ATTENTION, MAMBA, PinUpdated
from engine.hashing import BlockHash


class PinState(StrEnum):
    PENDING = "pending"
    MATERIALIZED = "materialized"
    FAILED = "failed"
    RELEASED = "released"


@dataclass
class Pin:
    pin_id: str
    num_tokens: int
    boundary: int
    key: BlockHash | None
    state: PinState = PinState.PENDING
    reason: str | None = None
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    unit_hashes: str = ""  # the prefix's chain as `RequestFinished.unit_hashes` carries it
    arrival_index: int | None = None  # its prefill's arrival index, once queued
    arrival_step: int | None = None  # the scheduler's step count when its prefill was queued

    @property
    def is_active(self) -> bool:
        return self.state in (PinState.PENDING, PinState.MATERIALIZED)

    @property
    def request_id(self) -> str:
        """The id of the prefill request that materializes the pin."""
        return f"pin:{self.pin_id}"

    def event(self) -> PinUpdated:
        """The pin as the `PinUpdated` event the scheduler emits and a snapshot carries."""
        return PinUpdated(
            pin_id=self.pin_id,
            state=self.state.value,
            num_tokens=self.num_tokens,
            boundary=self.boundary,
            keys={group: self.key.hex() for group in (ATTENTION, MAMBA)} if self.key else {},
            block_ids={g: list(ids) for g, ids in self.block_ids.items()},
            reason=self.reason,
            arrival_index=self.arrival_index,
            unit_hashes=self.unit_hashes,
            arrival_step=self.arrival_step,
        )
