"""`create_app`: the router's OpenAI-compatible server over a `Fleet`: its routes
(`routes/`), its state (`deps.py`), and the
feed followers and discovery that run while it serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from engine.model.tokenizer import Tokenizer
from protocol.body_limit import BodyLimit
from protocol.body_size import DEFAULT_MAX_BODY_BYTES, MAX_BODY_SETTING
from protocol.errors import install_error_handlers
from router.deps import RouterState
from router.engines import DEFAULT_READ_TIMEOUT_S, FINISH_WAIT_S
from router.fleet import Fleet
from router.proxy import Proxy
from router.readiness import Readiness, watch
from router.routes import decide as decide_routes
from router.routes import fleet as fleet_routes
from router.routes import messages as messages_routes
from router.routes import openai as openai_routes
from router.routes import ops as ops_routes


def create_app(
    fleet: Fleet,
    tokenizer: Tokenizer,
    tokens: tuple[str, ...],
    background: Callable[[], list[Coroutine[Any, Any, None]]] = list,
    client: httpx.AsyncClient | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    readiness: Readiness | None = None,
    finish_wait_s: float = FINISH_WAIT_S,
) -> FastAPI:
    """`tokens` are the bearer tokens `/fleet` takes; `background()` gives the coroutines that
    run while the app serves (each engine's feed follower, discovery); `read_timeout_s` is
    the longest an engine may send nothing of an answer (`--read-timeout`); a body over
    `max_body_bytes` is refused 413 before it is held (`protocol.body_limit`); `readiness`
    is the fleet's status since the router started (a new one counts from now);
    `finish_wait_s` is how long an answer's end waits for the feed (`--finish-wait-s`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: RouterState = app.state.router
        http = client or httpx.AsyncClient(
            timeout=httpx.Timeout(connect=2.0, read=read_timeout_s, write=60.0, pool=10.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )
        state.proxy = Proxy(
            fleet, state.metrics, http, finish_wait_s=finish_wait_s, read_timeout_s=read_timeout_s
        )
        coroutines = [*background(), watch(state.readiness)]
        tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if client is None:
                await http.aclose()

    app = FastAPI(
        title="Junction router",
        summary="One OpenAI endpoint over a fleet of engines, routed by usable hybrid hit",
        lifespan=lifespan,
    )
    app.state.router = RouterState(fleet, tokenizer, tokens, background, readiness)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, setting=MAX_BODY_SETTING)

    for module in (openai_routes, messages_routes, fleet_routes, decide_routes, ops_routes):
        app.include_router(module.router)
    return app
