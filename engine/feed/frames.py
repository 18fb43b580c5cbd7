"""The feed's frames on the wire (msgpack): hello, snapshot, delta, heartbeat, and the close
codes of `WS /v1/cache/feed`. Keys are the raw 16-byte chained hashes (`engine.hashing`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from engine.cache.lookup import HitGeometry
from engine.events import GROUPS

# `WS /v1/cache/feed`'s close codes, whoever serves it
CLOSE_UNAUTHORIZED = 4401  # a missing or wrong bearer token
CLOSE_NO_TOKEN = 4403  # the server has no token, so it serves no feed
CLOSE_FELL_BEHIND = 1013  # reconnect: a new connection starts from a snapshot
CLOSE_ENGINE_DEAD = 1011
GROUP_NAMES = GROUPS  # a frame's group index -> its name
GROUP_INDEX = {name: index for index, name in enumerate(GROUP_NAMES)}


# Every number a frame carries is bounded, so that a broken or hostile feed is refused at
# decoding (`msgspec.ValidationError`, naming the field) and its engine taken out, never the
# router that reads it: counts and seqs are non-negative, shares lie in [0, 1] (not NaN).
Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
Name = Annotated[str, Meta(max_length=256)]
Key = Annotated[bytes, Meta(max_length=64)]
#: the most tokens one request may hold that a hello may announce
MAX_REQUEST_TOKENS = 1 << 32


#: a measured rate (tokens or bytes per second): positive and finite, never NaN
Rate = Annotated[float, Meta(gt=0.0, le=1e18)]
#: the media of the tiers a feed announces keys of (`engine.events.TIER_MEDIA`, and "shared":
#: the fleet-wide store any engine of the model loads from)
TierMedium = Literal["host", "disk", "shared"]
#: the longest a shared entry may be announced to live
MAX_TTL_S = 30 * 24 * 3600.0


class FeedRates(Struct, frozen=True, array_like=True):
    """What the engine measured (`Engine.price_tier_loads`): a router prices a request on it
    in predicted prefill seconds. A tier's rate is None where the engine has no such tier."""

    prefill_tokens_per_s: Rate
    host_bytes_per_s: Rate | None = None
    disk_bytes_per_s: Rate | None = None
    shared_bytes_per_s: Rate | None = None
    # how long an entry of the shared store lives after it is put (None: not said)
    shared_ttl_s: Annotated[float, Meta(gt=0.0, le=MAX_TTL_S)] | None = None
    # whether the engine reaches its shared store now (None: it has none): a router prices
    # no shared hit for an engine that cannot load one, and `/fleet` says so
    shared_up: bool | None = None


class FeedLoad(Struct, frozen=True, array_like=True):
    num_running: Count
    num_waiting: Count
    num_prefill_tokens: Count  # prompt tokens admitted or queued and not yet computed
    attention_usage: Share  # share of the group's blocks held by requests or pins
    mamba_usage: Share
    # the engine's measured rates; None from an engine that measures none (a trailing
    # element: a reader before it ignores it, a feed before it decodes as None)
    rates: FeedRates | None = None


class FeedFinished(Struct, frozen=True, array_like=True):
    request_id: Name
    num_prompt_tokens: Count
    num_cached_tokens: Count


class KeyChange(Struct, frozen=True, array_like=True):
    op: Literal["store", "remove", "clear"]
    group: Annotated[int, Meta(ge=0, le=len(GROUPS) - 1)]  # 0 attention, 1 mamba
    keys: list[bytes]


class TierChange(Struct, frozen=True, array_like=True):
    """A usable-hit unit (`engine.tiers.unit`) a tier below the device stored or gave up: the
    attention of `[start, end)` and the state at `end`, keyed by the chain hash at `end`, its
    parent keyed at `start`. A snapshot's are all stores."""

    op: Literal["store", "remove"]
    medium: TierMedium
    key: Key
    parent: Key | None = None
    start: Count = 0
    end: Count = 0
    num_bytes: Count = 0  # what loading it reads; 0: not known

    def __post_init__(self) -> None:
        if self.op == "store" and not (
            self.start < self.end and (self.parent is None) == (self.start == 0)
        ):
            raise ValueError(
                f"tier unit [{self.start}, {self.end}) with "
                f"{'no' if self.parent is None else 'a'} parent"
            )


class FeedHello(Struct, frozen=True, tag="hello"):
    engine_id: Name
    epoch: Count
    geometry: HitGeometry
    model: Name
    # the most prompt + output tokens one request may hold
    max_request_tokens: Annotated[int, Meta(ge=1, le=MAX_REQUEST_TOKENS)]
    # the OpenAI base URL requests go to, when someone else than the engine serves the feed
    # (`junction attach --feed-port`: the peer's `--serve-url`); None: the feed's own host
    serve_url: str | None = None
    # whether deltas name the requests that finished (a peer's events carry no request ids)
    reports_finished: bool = True


class FeedSnapshot(Struct, frozen=True, tag="snapshot"):
    seq: Count
    attention: list[bytes]
    mamba: list[bytes]
    load: FeedLoad
    tiers: list[TierChange] = []  # the units the tiers below the device hold (stores)


class FeedDelta(Struct, frozen=True, tag="delta"):
    seq: Count
    changes: list[KeyChange]
    finished: list[FeedFinished]
    load: FeedLoad
    tiers: list[TierChange] = []  # the tiers' stores and removals, in order


class FeedHeartbeat(Struct, frozen=True, tag="heartbeat"):
    seq: Count  # the last delta's seq
    load: FeedLoad


FeedFrame = FeedHello | FeedSnapshot | FeedDelta | FeedHeartbeat
encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(FeedFrame)


def decode(data: bytes) -> FeedFrame:
    """One frame; `msgspec.ValidationError` or `DecodeError` for a bad one."""
    return _decoder.decode(data)
