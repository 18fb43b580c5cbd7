"""`/healthz` (the database answers) and `/metrics` (Prometheus), at the root.

`/healthz` is a coroutine: it takes none of the worker threads the REST routes share, and its
query runs at most every half second, in a thread of its own (`api.store.health`), so heavy
reads cannot keep a balancer's health check waiting."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import StateDep
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(state: StateDep):
    health = await state.health.check(state.db)
    if not health.is_ok:
        body = Health(status="unavailable", database=health.database)
        return JSONResponse(body.model_dump(), status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    return Health(status="ok", database=health.database)


@router.get("/metrics", response_class=Response)
def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
