"""What an engine ran, as a what-if replays it: each request's chained unit hashes and lengths.

A recording holds no token and no text: a request is its chain of match-unit hashes (the
control plane's salted ones, or an engine's raw ones; only their equality matters), its prompt
and output lengths, where its chat messages ended and when it arrived. The chain's unit is the
finest match unit a what-if can try: a hash every `unit` tokens says which prefixes were equal
at multiples of `unit`, and nothing finer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

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


class Recording(msgspec.Struct, forbid_unknown_fields=True):
    """An engine's settings (its hello geometry) and its requests in arrival order."""

    geometry: CacheGeometry
    unit: int  # tokens per hash of every chain
    requests: list[RecordedRequest] = []
    # requests in flight at once when no arrival steps were recorded (a trace's replay window)
    concurrency: int = 1

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
    concurrency: int = 1


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
