"""What-if runs: replay an engine's recorded requests (their salted unit chains, kept at
ingest) under other settings on a Celery worker (`jobs.whatif`), and read the reports back.

A run is a row of the store (`api.whatif.runs`) that a worker takes, reports progress on, and
ends done (with its report) or failed (with the reason). The chains themselves are never
served: a report holds token counts only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, status
from sqlalchemy.orm import Session

from api.deps import MAX_INT64, READ, EngineDep, Offset, RequireWrite, SessionDep, StateDep
from api.guards import json_body
from api.openapi import (
    BODY_ERRORS,
    ENGINE_NOT_FOUND,
    WRITE_ERRORS,
    ValidationErrorOut,
    error,
)
from api.runs.broker import BrokerUnavailable, send_whatif
from api.schemas import WhatIfBody, WhatIfRunOut, WhatIfRunPage, WhatIfStatus
from api.settings import Settings
from api.store.models import Engine, WhatIfRun
from api.whatif import runs
from api.whatif.recording import NoRecording, recorded_size, request_sizes, resolve_epoch
from whatif import budget
from whatif.settings import WhatIfSetting, apply, check_memory, parse_settings, ran_configs

router = APIRouter(tags=["whatif"], dependencies=[READ])
MAX_LIMIT = 1000
EXAMPLE = {
    "settings": [
        {"label": "as vLLM would", "mode": "vllm"},
        {"eviction": "lru"},
        {"num_blocks": 4096, "num_mamba_blocks": 256},
    ]
}
Body = Annotated[WhatIfBody, Depends(json_body.JsonBody(WhatIfBody))]


@router.post(
    "/engines/{engine_id}/whatif",
    response_model=WhatIfRunOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses=WRITE_ERRORS
    | BODY_ERRORS
    | ENGINE_NOT_FOUND
    | {
        409: error(
            "the engine has no recorded request chains (in that epoch), or its settings "
            "cannot be replayed"
        ),
        422: error(
            "a setting is not valid or cannot be tried, or the run's estimate is over "
            "JUNCTION_WHATIF_MAX_BYTES or JUNCTION_WHATIF_MAX_SECONDS (`detail` names it)",
            ValidationErrorOut,
        ),
        429: error("JUNCTION_WHATIF_MAX_RUNS runs are queued or running"),
        503: error("the store's database or the Celery broker is unreachable; nothing was queued"),
    },
    openapi_extra=json_body.openapi(WhatIfBody, examples=[EXAMPLE]),
)
def create_whatif(
    _: RequireWrite, body: Body, engine: EngineDep, session: SessionDep, state: StateDep
) -> WhatIfRunOut:
    """Queue a replay of the engine's recorded requests (one epoch: the newest by default)
    under each of `settings`, beside its own settings; a worker runs it (`junction worker`)."""
    try:
        settings = parse_settings(body.settings)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    try:
        epoch = resolve_epoch(session, engine.engine_id, body.epoch)
    except NoRecording as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    _check_settings(session, engine, epoch, settings, state.settings)
    broker_url = state.settings.broker_url
    try:
        run = runs.submit_run(
            session,
            engine.engine_id,
            epoch,
            [setting.model_dump(exclude_none=True) for setting in settings],
            lambda run_id, task_id: send_whatif(broker_url, run_id, task_id),
            state.settings.whatif_max_runs,
        )
    except runs.TooManyRuns as exc:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(exc)) from exc
    except BrokerUnavailable as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"{exc}; the what-if was not queued"
        ) from exc
    return WhatIfRunOut.model_validate(run)


def _check_settings(
    session: Session, engine: Engine, epoch: int, settings: list[WhatIfSetting], config: Settings
) -> None:
    """409 when the engine's own settings cannot be replayed; 422 naming the setting that
    cannot be tried, or the bound (`JUNCTION_WHATIF_MAX_BYTES`, `_SECONDS`) the run's
    estimate is over (`whatif.budget`)."""
    geometry = engine.geometry
    try:
        ran, _scheduler = ran_configs(geometry)
    except ValueError as exc:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"the engine's settings cannot be replayed: {exc}"
        ) from exc
    longest, pins = request_sizes(session, engine.engine_id, epoch)
    named = [("as ran", ran)]
    try:
        for setting in settings:
            named.append((setting.name(), apply(setting, ran, geometry.prefix_match_unit)))
            check_memory(named[-1][1], longest, pins, setting.name())
        size = recorded_size(session, engine.engine_id, epoch, config.whatif_max_requests)
        limits = budget.Limits(config.whatif_max_bytes, config.whatif_max_seconds)
        budget.check(budget.estimate(size, named), limits, len(named))
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc


@router.get(
    "/engines/{engine_id}/whatif",
    response_model=WhatIfRunPage,
    responses=ENGINE_NOT_FOUND,
)
def list_whatif(
    engine: EngineDep,
    session: SessionDep,
    run_status: Annotated[WhatIfStatus | None, Query(alias="status")] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
) -> WhatIfRunPage:
    """The engine's what-if runs, newest first; `status` keeps the runs in that state."""
    total, rows = runs.list_runs(session, engine.engine_id, run_status, limit, offset)
    return WhatIfRunPage(
        total=total,
        offset=offset,
        limit=limit,
        runs=[WhatIfRunOut.model_validate(row) for row in rows],
    )


@router.get(
    "/whatif/{run_id}",
    response_model=WhatIfRunOut,
    responses={404: error("no what-if run of that id")},
)
def get_whatif(
    run_id: Annotated[int, Path(ge=1, le=MAX_INT64)], session: SessionDep
) -> WhatIfRunOut:
    """One what-if run: its status, progress and, once done, its report."""
    run = session.get(WhatIfRun, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"what-if run {run_id} not found")
    return WhatIfRunOut.model_validate(run)
