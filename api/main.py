"""The control plane's FastAPI app: `create_app()` builds it (the routers, the state)."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from api import openapi
from api.guards.errors import install_error_handlers
from api.guards.limits import RequestLimits, refuse_nul_parameters
from api.guards.read_limit import ReadLimit
from api.lifespan import lifespan
from api.openapi import API_ERRORS, OPEN_ERRORS
from api.routes import (
    attribution,
    block_grid,
    blocks,
    dead_letters,
    docs,
    engines,
    events,
    health,
    hit_rate,
    ingest,
    junctions,
    pins,
    replicas,
    requests,
)
from api.routes.peers import blocks as peer_blocks
from api.routes.peers import views as peer_views
from api.routes.runs import benchmarks, whatif
from api.settings import Settings, get_settings
from api.state import AppState

API_PREFIX = "/api/v1"
DESCRIPTION = """\
Engines stream their cache events to the websocket **`/api/v1/ingest`** (not listed below:
OpenAPI has no websockets). Send `Authorization: Bearer <JUNCTION_API_TOKEN>` (or `?token=`),
then the frames of `engine.wire`: `hello` (answered by `welcome {epoch, next_seq}`), then
`batch` and `snapshot` frames, each answered by `ack {seq}` once committed. Bad input closes
the socket: 4403 a browser `Origin` not in `JUNCTION_ALLOWED_ORIGINS`, 4401 token, 4400 bad
frame, 4409 another engine or epoch, 4410 superseded by a newer hello of the engine (on any
replica), 4422 a seq from the future, 1009 too big. The control
plane sends `command` frames down the same socket: `pin {pin_id, token_ids, cache_salt}` and
`unpin {pin_id}`, every active pin again after each hello.

Every route but `/healthz` and `/metrics` needs a bearer token: reads take
`JUNCTION_API_TOKEN` or the read-only `JUNCTION_READ_TOKEN`; writes and the socket only
`JUNCTION_API_TOKEN`.
"""
ROUTERS = (
    engines,
    blocks,
    block_grid,
    peer_blocks,
    peer_views,
    requests,
    dead_letters,
    hit_rate,
    attribution,
    events,
    pins,
    junctions,
    ingest,
    benchmarks,
    whatif,
    replicas,
)
# Routes whose bodies may be larger than `max_body_bytes`, and the setting of their limit.
BODY_LIMITS = {("POST", f"{API_PREFIX}/pins"): "max_pin_body_bytes"}


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app over `settings`' database (default: `get_settings()`); the schema must exist
    (`alembic upgrade head`, which `junction api` runs first)."""
    app = FastAPI(
        title="Junction control plane",
        version="1",
        summary="The store of every engine's prefix-cache events, and a REST API over it.",
        description=DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(refuse_nul_parameters)],
        # served from local assets (`api.routes.docs`): Swagger UI's CDN may be out of reach
        docs_url=None,
        redoc_url=None,
    )
    app.state.junction = AppState.from_settings(settings or get_settings())
    app.add_middleware(RequestLimits, settings=app.state.junction.settings, body_limits=BODY_LIMITS)
    app.add_middleware(ReadLimit, settings=app.state.junction.settings)  # outermost: reads wait
    install_error_handlers(app)
    for module in ROUTERS:
        app.include_router(module.router, prefix=API_PREFIX, responses=API_ERRORS)
    app.include_router(health.router, responses=OPEN_ERRORS)
    docs.install_docs(app)
    openapi.install(app)
    return app
