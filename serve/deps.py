"""What routes get from the app: the `ServerState`, as an `Annotated` dependency."""

from __future__ import annotations

from dataclasses import dataclass, field
from time import time
from typing import Annotated

from fastapi import Depends, Request

from engine.feed import FeedHub
from engine.model.tokenizer import Tokenizer
from serve.async_engine import AsyncEngine
from serve.diagnosis import DiagnosisOracle
from serve.metrics import ServerMetrics


@dataclass(frozen=True)
class ServerState:
    async_engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    tokenizer: Tokenizer
    model_card: dict  # what `/v1/models` says of the model beyond its name
    created: int = field(default_factory=lambda: int(time()))
    feed: FeedHub | None = None  # the cache feed routers subscribe to, if served
    feed_token: str | None = None  # the bearer token the feed takes
    diagnosis: DiagnosisOracle | None = None  # why a request missed, asked per request


def get_state(request: Request) -> ServerState:
    return request.app.state.server


StateDep = Annotated[ServerState, Depends(get_state)]
