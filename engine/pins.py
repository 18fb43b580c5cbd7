"""Operator pins: a prefix whose Mamba checkpoint and attention blocks are never evicted.

A pin is materialized by a prefill of its prefix up to the boundary (the length floored to the
hit grid); the entries that lookups would follow to that boundary are then pinned, within a cap
on the share of each group's blocks that pins may hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from engine.cache.coordinator import ATTENTION, MAMBA, HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.events import PinUpdated
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

    @property
    def is_active(self) -> bool:
        return self.state in (PinState.PENDING, PinState.MATERIALIZED)

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
        )


def pin_blocks(
    coordinator: HybridCoordinator, hashes: list[BlockHash], boundary: int
) -> dict[str, list[int]] | str:
    """The blocks holding the entries a lookup follows to `boundary`, or why there are none."""
    unit = coordinator.unit
    attention = coordinator.attention
    size = attention.block_size
    entries = attention.pool.entries
    attention_ids: list[int] = []
    positions = list(range(size, boundary + 1, size))
    if boundary % size:
        positions.append(boundary)
    for position in positions:
        entry = entries.get(hashes[position // unit - 1])
        if entry is None:
            return f"attention entry at position {position} is missing"
        attention_ids.append(entry.block_id)
    checkpoint = coordinator.mamba.pool.entries.get(hashes[boundary // unit - 1])
    if checkpoint is None:
        return f"mamba checkpoint at position {boundary} is missing"
    return {ATTENTION: attention_ids, MAMBA: [checkpoint.block_id]}


def materialize(
    coordinator: HybridCoordinator, pin: Pin, hashes: list[BlockHash], max_share: float
) -> None:
    """Pin the prefix's blocks and raise its entries to `pin`, or mark the pin failed."""
    found = pin_blocks(coordinator, hashes, pin.boundary)
    if isinstance(found, str):
        pin.state, pin.reason = PinState.FAILED, found
        return
    pools = coordinator.pools
    for group, block_ids in found.items():
        pool = pools[group]
        added = sum(1 for b in set(block_ids) if not pool.blocks[b].pin_cnt)
        cap = int(pool.num_blocks * max_share)
        if pool.num_pinned + added > cap:
            pin.state = PinState.FAILED
            pin.reason = (
                f"pin would hold {pool.num_pinned + added} of {pool.num_blocks} {group} blocks; "
                f"the cap is {cap} ({max_share:.0%})"
            )
            return
    for group, block_ids in found.items():
        pool = pools[group]
        for block_id in block_ids:
            pool.pin(block_id)
        boundary_key = hashes[pin.boundary // coordinator.unit - 1]
        pool.cache(
            pool.entries[boundary_key].block_id,
            [(boundary_key, pin.boundary, CheckpointReason.PIN)],
            None,
        )
    pin.block_ids = found
    pin.state = PinState.MATERIALIZED


def release(coordinator: HybridCoordinator, pin: Pin) -> None:
    pools = coordinator.pools
    if pin.state is PinState.MATERIALIZED:
        for group, block_ids in pin.block_ids.items():
            for block_id in block_ids:
                pools[group].unpin(block_id)
    pin.state = PinState.RELEASED
    pin.block_ids = {}
