"""`/healthz` (the database answers) and `/metrics` (Prometheus), at the root."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.deps import StateDep
from api.schemas import Health

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(state: StateDep):
    try:
        with state.db.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        log.error("health check: database unreachable: %s", exc)
        body = Health(status="unavailable", database=f"error: {type(exc).__name__}")
        return JSONResponse(body.model_dump(), status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    return Health(status="ok", database=state.db.dialect.name)


@router.get("/metrics", response_class=Response)
def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
