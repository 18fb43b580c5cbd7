"""What the router's routes get from the app: its `RouterState` and the bearer-token check of
the `/fleet` routes, as `Annotated` dependencies."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request

from engine.model.tokenizer import Tokenizer
from protocol.errors import OpenAIError
from router.fleet import Fleet
from router.metrics import RouterMetrics
from router.proxy import Proxy
from router.readiness import Readiness


class RouterState:
    def __init__(
        self,
        fleet: Fleet,
        tokenizer: Tokenizer,
        tokens: tuple[str, ...],
        background: Callable[[], list[Coroutine[Any, Any, None]]],
        readiness: Readiness | None = None,
    ) -> None:
        self.fleet = fleet
        self.readiness = readiness or Readiness(fleet)  # `/fleet`'s status: ready or degraded
        self.tokenizer = tokenizer
        self.tokens = tokens  # bearer tokens `/fleet` takes
        self.background = background  # the feed followers and discovery, started with the app
        self.metrics = RouterMetrics(fleet)
        self.started = int(time.time())
        self.proxy: Proxy | None = None


def _state(request: Request) -> RouterState:
    return request.app.state.router


StateDep = Annotated[RouterState, Depends(_state)]


def _authorized(request: Request, state: StateDep) -> None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not any(
        secrets.compare_digest(token, t) for t in state.tokens
    ):
        raise OpenAIError(
            "GET /fleet reads routing records: send Authorization: Bearer <JUNCTION_API_TOKEN "
            "or JUNCTION_READ_TOKEN>",
            401,
            code="unauthorized",
        )


Authorized = Depends(_authorized)


Authorized = Depends(_authorized)
