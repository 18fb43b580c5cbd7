"""What an engine ran, as a what-if replays it: each request's chained unit hashes and lengths.

A recording holds no token and no text: a request is its chain of match-unit hashes (the
control plane's salted ones, or an engine's raw ones; only their equality matters), its prompt
and output lengths, where its chat messages ended and when it arrived. The chain's unit is the
finest match unit a what-if can try: a hash every `unit` tokens says which prefixes were equal
at multiples of `unit`, and nothing finer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import msgspec

from engine.events import PinUpdated, RequestFinished
from engine.geometry import CacheGeometry


class RecordedRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One finished request (or, `pin` True, a pin's prefix) as the engine saw it."""

    id: str
    units: list[int]  # chained unit hashes of prompt and output, one every `Recording.unit` tokens
    num_prompt_tokens: int
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # the hit the engine reported
    arrival_index: int = 0  # the engine's arrival order
    arrival_step: int | None = None  # the engine's step count when it arrived (None: unknown)
    checkpoint_offsets: list[int] = []  # where its chat messages ended
    pin: bool = False
    name: str | None = None  # a pin's name as its user knows it (its label), for reports


class Recording(msgspec.Struct, forbid_unknown_fields=True):
    """An engine's settings (its hello geometry) and its requests in arrival order."""

    geometry: CacheGeometry
    unit: int  # tokens per hash of every chain
    requests: list[RecordedRequest] = []
    # None: requests enter at the steps they arrived in (a live engine's traffic); N: at most
    # N in flight, the next entering as one finishes (a trace replayed `--concurrency N`)
    concurrency: int | None = None

    @property
    def num_requests(self) -> int:
        return sum(1 for r in self.requests if not r.pin)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.requests if not r.pin)

    @property
    def num_cached_tokens(self) -> int:
        return sum(r.num_cached_tokens for r in self.requests if not r.pin)


_HEADER = msgspec.json.Encoder()


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    geometry: CacheGeometry
    unit: int
    concurrency: int | None = None


def dump_lines(recording: Recording) -> Iterator[bytes]:
    """A recording as JSON lines: a header (geometry, unit, concurrency), then one request a
    line (`junction whatif --recording` reads them back)."""
    yield _HEADER.encode(_Header(recording.geometry, recording.unit, recording.concurrency))
    for request in recording.requests:
        yield _HEADER.encode(request)


def load_lines(lines: Iterable[bytes | str]) -> Recording:
    """`dump_lines`' output back; a `ValueError` names the line that is wrong."""
    header: _Header | None = None
    requests: list[RecordedRequest] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            if header is None:
                header = msgspec.json.decode(line, type=_Header)
            else:
                requests.append(msgspec.json.decode(line, type=RecordedRequest))
        except msgspec.ValidationError as exc:
            what = "the header" if header is None else "a request"
            raise ValueError(f"recording line {number} ({what}): {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ValueError(f"recording line {number}: not JSON ({exc})") from exc
    if header is None:
        raise ValueError("the recording is empty: its first line must be the header")
    return Recording(header.geometry, header.unit, requests, header.concurrency)


def chain_of(unit_hashes: str) -> list[int]:
    """An event's `unit_hashes` (8 bytes a unit, hex) as the signed 64-bit integers the store
    keeps its salted ones as."""
    raw = bytes.fromhex(unit_hashes)
    return list(struct.unpack(f">{len(raw) // 8}q", raw))


def is_pin_prefill(event: object) -> bool:
    """A pin's prefill entering the engine: its `pending` event once queued (it has an arrival
    index then). The prefill runs and caches its prefix whether the pin then holds or fails,
    so a what-if replays it either way."""
    return (
        isinstance(event, PinUpdated)
        and event.state == "pending"
        and event.arrival_index is not None
    )


def from_events(
    geometry: CacheGeometry, events: Iterable[object], concurrency: int | None = None
) -> Recording:
    """A recording of one engine epoch from its events (`RequestFinished`, and the
    `PinUpdated` of each pin prefill queued; others are skipped), with the engine's raw
    hashes. A request that reported no chain (`unit_hashes` empty) cannot be replayed:
    `ValueError`."""
    unit = geometry.prefix_match_unit
    if unit is None:
        raise ValueError("the engine's geometry has no prefix_match_unit: nothing to replay")
    requests = []
    for event in events:
        if isinstance(event, RequestFinished):
            if not event.unit_hashes and event.num_prompt_tokens >= unit:
                raise ValueError(f"request {event.request_id!r} reported no unit hashes")
            requests.append(
                RecordedRequest(
                    event.request_id,
                    chain_of(event.unit_hashes),
                    event.num_prompt_tokens,
                    event.num_output_tokens,
                    event.num_cached_tokens,
                    event.arrival_index,
                    event.arrival_step,
                    list(event.checkpoint_offsets),
                )
            )
        elif is_pin_prefill(event):
            requests.append(
                RecordedRequest(
                    event.pin_id,
                    chain_of(event.unit_hashes),
                    event.boundary,
                    arrival_index=event.arrival_index or 0,
                    arrival_step=event.arrival_step,
                    pin=True,
                    name=event.pin_id,
                )
            )
    requests.sort(key=lambda r: r.arrival_index)
    return Recording(geometry, unit, requests, concurrency)


class ChainSink:
    """An event sink that keeps only what a recording needs (finished requests, pin
    prefills), so recording a long trace holds no block events."""

    is_recording = True

    def __init__(self) -> None:
        self.events: list[RequestFinished | PinUpdated] = []

    def emit(self, event: object) -> None:
        if isinstance(event, RequestFinished) or is_pin_prefill(event):
            self.events.append(event)
