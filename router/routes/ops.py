"""`/health` (200 while an engine is up, else 503; `fleet` says whether every engine is in) and
`/metrics` (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from router.deps import StateDep

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health(state: StateDep) -> JSONResponse:
    up = state.fleet.up()
    body = {"status": "ok" if up else "no_engine", "num_up": len(up)}
    body["num_engines"] = len(state.fleet.engines)
    body["fleet"] = state.readiness.observe()  # "ready", "degraded" or "no_engine"
    return JSONResponse(body, 200 if up else 503)


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
