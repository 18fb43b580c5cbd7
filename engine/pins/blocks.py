"""Pinning a pin's blocks in the pools: the blocks a lookup follows to its boundary, pinned
within the cap on the share of each group's blocks, and unpinned on release."""

from __future__ import annotations

from engine.cache.coordinator import HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.events import ATTENTION, MAMBA
from engine.hashing import BlockHash
from engine.pins.pin import Pin, PinState


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
