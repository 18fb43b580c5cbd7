"""`PinManager`: an engine's pins through their lifecycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.cache.coordinator import HybridCoordinator
from engine.config import CacheConfig
from engine.events import EventSink
from engine.hashing import hash_prefix, short_hashes
from engine.pins.blocks import materialize, release
from engine.pins.pin import Pin, PinState
from engine.request import Request, SamplingParams


class PinPrefill(NamedTuple):
    pin: Pin
    request: Request | None  # the prefill to queue; None when the pin failed at once


@dataclass
class PinManager:
    """An engine's pins: adding one (its boundary and prefill), its materialization or failure,
    its release, the `PinUpdated` events, and which pins a request's checkpoints include.

    Released and failed pins stay listed under their id (a snapshot reports their last state)
    until a new pin of that id replaces them.
    """

    coordinator: HybridCoordinator
    config: CacheConfig
    sink: EventSink
    pins: dict[str, Pin] = field(default_factory=dict)

    @property
    def num_pins(self) -> int:
        """Every pin listed, released and failed ones included."""
        return len(self.pins)

    def add(self, pin_id: str, token_ids: list[int], cache_salt: str | None = None) -> PinPrefill:
        """List a pin at its boundary (its length floored to the hit grid) and build the prefill
        request that materializes it; the caller queues that request, then `emit`s the pin."""
        if pin_id in self.pins and self.pins[pin_id].is_active:
            raise ValueError(f"pin {pin_id!r} already exists; unpin it first")
        alignment, unit = self.config.hit_alignment, self.config.match_unit
        boundary = len(token_ids) // alignment * alignment
        if boundary == 0:
            raise ValueError(
                f"pin {pin_id!r}: its {len(token_ids)} tokens floor to a boundary of 0 on this "
                f"engine's {alignment}-token hit grid; pin a prefix of at least {alignment} tokens"
            )
        prefix = list(token_ids[:boundary])
        hashes = hash_prefix(prefix, unit, cache_salt)
        pin = Pin(pin_id, len(token_ids), boundary, hashes[-1], unit_hashes=short_hashes(hashes))
        self.pins[pin_id] = pin
        if not self.config.enable_prefix_caching:
            self.fail(pin, "prefix caching is off on this engine")
            return PinPrefill(pin, None)
        request = Request(
            pin.request_id,
            prefix,
            SamplingParams(max_tokens=0),
            unit,
            cache_salt,
            pin_id=pin_id,
        )
        return PinPrefill(pin, request)

    def find(self, pin_id: str) -> Pin:
        pin = self.pins.get(pin_id)
        if pin is None:
            raise KeyError(f"no pin {pin_id!r}; known pins: {sorted(self.pins)}")
        return pin

    def materialize(self, request: Request) -> Pin:
        """Pin the blocks its finished prefill left (or mark it failed); emits nothing."""
        pin = self.pins[request.pin_id]
        materialize(self.coordinator, pin, request.block_hashes, self.config.pin_max_share)
        return pin

    def prefill_ended(self, request: Request, reason: str) -> None:
        """A pin's prefill finished: a pin still pending never materialized."""
        pin = self.pins.get(request.pin_id)
        if pin is not None and pin.state is PinState.PENDING:
            self.fail(pin, f"materialization ended: {reason}")

    def release(self, pin: Pin) -> None:
        """Unpin the pin's blocks and emit it released (its prefill must be aborted first)."""
        release(self.coordinator, pin)
        self.emit(pin)

    def fail(self, pin: Pin, reason: str) -> None:
        pin.state, pin.reason = PinState.FAILED, reason
        self.emit(pin)

    def emit(self, pin: Pin) -> None:
        self.sink.emit(pin.event())

    def boundaries(self, request: Request) -> list[int]:
        """The pinned boundaries among `request`'s checkpoint targets.

        A pin's own prefill keeps its boundary (the whole prompt); with partial hits it also
        keeps the resend checkpoint an exact resend of the pinned prefix hits (every hit stops
        short of the whole prompt), cached, not pinned, so it may be evicted like any other;
        and its junction, like any request's. Another request keeps every active pin's boundary
        that lies inside its prompt. This does not change any pin.
        """
        if request.is_pin:
            return [request.num_prompt_tokens]
        unit, hashes = self.config.match_unit, request.block_hashes
        return [
            pin.boundary
            for pin in self.pins.values()
            if pin.is_active
            and pin.boundary <= request.num_prompt_tokens
            and hashes[pin.boundary // unit - 1] == pin.key
        ]

    def hits(self, request: Request, hit_length: int) -> dict[str, int]:
        """Pin id -> boundary for each materialized pin a hit of `hit_length` covers."""
        unit, hashes = self.config.match_unit, request.block_hashes
        return {
            pin.pin_id: pin.boundary
            for pin in self.pins.values()
            if pin.state is PinState.MATERIALIZED
            and pin.boundary <= hit_length
            and hashes[pin.boundary // unit - 1] == pin.key
        }

    def check_invariants(self) -> None:
        """A materialized pin holds pinned blocks in both groups; no other pin holds any."""
        pools = self.coordinator.pools
        for pin in self.pins.values():
            if pin.state is not PinState.MATERIALIZED:
                if pin.block_ids:
                    raise InvariantError(
                        f"pin {pin.pin_id} is {pin.state.value} but holds blocks {pin.block_ids}"
                    )
                continue
            if set(pin.block_ids) != set(pools):
                raise InvariantError(
                    f"pin {pin.pin_id} is materialized but holds blocks only in "
                    f"{sorted(pin.block_ids)}"
                )
            for group, block_ids in pin.block_ids.items():
                for block_id in block_ids:
                    if not pools[group].blocks[block_id].pin_cnt:
                        raise InvariantError(
                            f"{group} block {block_id}: held by pin {pin.pin_id} but not pinned"
                        )
