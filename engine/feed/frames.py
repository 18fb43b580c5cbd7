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
#: the most tokens one request may hold that a hello may announce
MAX_REQUEST_TOKENS = 1 << 32


class FeedLoad(Struct, frozen=True, array_like=True):
    num_running: Count
    num_waiting: Count
    num_prefill_tokens: Count  # prompt tokens admitted or queued and not yet computed
    attention_usage: Share  # share of the group's blocks held by requests or pins
    mamba_usage: Share


class FeedFinished(Struct, frozen=True, array_like=True):
    request_id: Name
    num_prompt_tokens: Count
    num_cached_tokens: Count


class KeyChange(Struct, frozen=True, array_like=True):
    op: Literal["store", "remove", "clear"]
    group: Annotated[int, Meta(ge=0, le=len(GROUPS) - 1)]  # 0 attention, 1 mamba
    keys: list[bytes]


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


class FeedDelta(Struct, frozen=True, tag="delta"):
    seq: Count
    changes: list[KeyChange]
    finished: list[FeedFinished]
    load: FeedLoad


class FeedHeartbeat(Struct, frozen=True, tag="heartbeat"):
    seq: Count  # the last delta's seq
    load: FeedLoad


FeedFrame = FeedHello | FeedSnapshot | FeedDelta | FeedHeartbeat
encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(FeedFrame)


def decode(data: bytes) -> FeedFrame:
    """One frame; `msgspec.ValidationError` or `DecodeError` for a bad one."""
    return _decoder.decode(data)
