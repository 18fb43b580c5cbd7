"""The feed's frames on the wire (msgpack): hello, snapshot, delta, heartbeat, and the close
codes of `WS /v1/cache/feed`. Keys are the raw 16-byte chained hashes (`engine.hashing`)."""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from engine.cache.lookup import HitGeometry
from engine.events import GROUPS

# `WS /v1/cache/feed`'s close codes, whoever serves it
CLOSE_UNAUTHORIZED = 4401  # a missing or wrong bearer token
CLOSE_NO_TOKEN = 4403  # the server has no token, so it serves no feed
CLOSE_FELL_BEHIND = 1013  # reconnect: a new connection starts from a snapshot
CLOSE_ENGINE_DEAD = 1011
GROUP_NAMES = GROUPS  # a frame's group index -> its name
GROUP_INDEX = {name: index for index, name in enumerate(GROUP_NAMES)}


class FeedLoad(Struct, frozen=True, array_like=True):
    num_running: int
    num_waiting: int
    num_prefill_tokens: int  # prompt tokens admitted or queued and not yet computed
    attention_usage: float  # share of the group's blocks held by requests or pins
    mamba_usage: float


class FeedFinished(Struct, frozen=True, array_like=True):
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int


class KeyChange(Struct, frozen=True, array_like=True):
    op: Literal["store", "remove", "clear"]
    group: int  # 0 attention, 1 mamba
    keys: list[bytes]


class FeedHello(Struct, frozen=True, tag="hello"):
    engine_id: str
    epoch: int
    geometry: HitGeometry
    model: str
    max_request_tokens: int  # the most prompt + output tokens one request may hold
    # the OpenAI base URL requests go to, when someone else than the engine serves the feed
    # (`junction attach --feed-port`: the peer's `--serve-url`); None: the feed's own host
    serve_url: str | None = None
    # whether deltas name the requests that finished (a peer's events carry no request ids)
    reports_finished: bool = True


class FeedSnapshot(Struct, frozen=True, tag="snapshot"):
    seq: int
    attention: list[bytes]
    mamba: list[bytes]
    load: FeedLoad


class FeedDelta(Struct, frozen=True, tag="delta"):
    seq: int
    changes: list[KeyChange]
    finished: list[FeedFinished]
    load: FeedLoad


class FeedHeartbeat(Struct, frozen=True, tag="heartbeat"):
    seq: int  # the last delta's seq
    load: FeedLoad


FeedFrame = FeedHello | FeedSnapshot | FeedDelta | FeedHeartbeat
encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(FeedFrame)


def decode(data: bytes) -> FeedFrame:
    """One frame; `msgspec.ValidationError` or `DecodeError` for a bad one."""
    return _decoder.decode(data)
