"""Pins (`GET /pins`, `POST /pins`, `DELETE /pins/{id}`) and the suggested junctions worth one
(`GET /junctions/suggested`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from client.types.base import Body


class PinTargetOut(Body):
    """One engine's side of a pin: `boundary` the prefix floored to its hit grid (None: its
    geometry gives none); `state` pending, materialized, failed (`reason` why) or released."""

    engine_id: str
    state: str
    boundary: int | None
    reason: str | None
    keys: dict[str, str]
    block_ids: dict[str, list[int]]
    num_hits: int
    tokens_saved: int
    updated_at: datetime


class PinOut(Body):
    """A pin: `targets` "all" or the engine ids; `origin` "engine" for a pin an engine
    reported that the API never made."""

    pin_id: str
    label: str
    origin: Literal["api", "engine"]
    num_tokens: int
    priority: int
    targets: Literal["all"] | list[str]
    state: Literal["pending", "materialized", "failed", "released"]
    boundary: dict[str, int | None]
    engines: list[PinTargetOut]
    num_hits: int
    tokens_saved: int
    created_at: datetime
    released_at: datetime | None


class PinDetail(PinOut):
    """A pin with its `source` (the text or messages as given) and, when asked, its tokens."""

    token_ids: list[int] | None
    source: dict[str, Any] | None


class JunctionPinRequest(Body):
    """A ready `POST /pins` body."""

    prefix: dict[str, list[int]]
    label: str


class JunctionOut(Body):
    """A position many requests' attention matches reached and no checkpoint covered: `key` is
    `H_boundary`; `tokens_saved` what a pin there would have saved them."""

    key: str
    boundary: int
    num_requests: int
    num_short_requests: int
    tokens_saved: int
    engine_ids: list[str]
    pin_request: JunctionPinRequest


class JunctionPage(Body):
    engine_id: str | None
    limit: int
    junctions: list[JunctionOut]
