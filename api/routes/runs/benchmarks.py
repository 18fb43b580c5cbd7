"""Benchmark runs: queue one for the Celery workers (`jobs`), list them, show one; and the
standard suite's specs, the presets a client offers.

A run is a row of the store (`api.runs.benchmarks`) that a worker takes, reports progress on, and
ends finished (with its results) or failed (with the reason)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError, WithJsonSchema

from api.deps import MAX_INT64, READ, Offset, RequireWrite, SessionDep, StateDep
from api.guards import json_body
from api.openapi import BODY_ERRORS, WRITE_ERRORS, ValidationErrorOut, error
from api.runs import benchmarks
from api.runs.broker import BrokerUnavailable, send_run
from api.runs.specs import spec_schema, standard_suite, validate_spec
from api.schemas import BenchmarkRunOut, BenchmarkRunPage, RunStatus
from api.store.models import BenchmarkRun

router = APIRouter(prefix="/benchmarks", tags=["benchmarks"], dependencies=[READ])
MAX_LIMIT = 1000
EXAMPLE_SPEC = {
    "name": "gsp-small",
    "workload": {"kind": "generated_shared_prefix", "seed": 0},
    "runner": "ledger",
    "modes": ["off", "aligned", "partial", "junction"],
    "concurrency": 8,
}
SpecBody = Annotated[dict[str, Any], Depends(json_body.JsonBody(dict[str, Any]))]
#: What the schema shows of the body: a spec (`validate_spec` checks it in the route, where a
#: failure is named in the spec's terms).
SpecSchema = Annotated[dict[str, Any], WithJsonSchema(spec_schema())]


@router.post(
    "",
    response_model=BenchmarkRunOut,
    status_code=status.HTTP_201_CREATED,
    responses=WRITE_ERRORS
    | BODY_ERRORS
    | {
        422: error(
            "not a valid benchmark spec, or one whose requests do not fit its geometry "
            "(what is wrong: `detail`)",
            ValidationErrorOut,
        ),
        503: error("the store's database or the Celery broker is unreachable; nothing was queued"),
    },
    openapi_extra=json_body.openapi(SpecSchema, examples=[EXAMPLE_SPEC]),
)
def create_benchmark(
    _: RequireWrite,
    spec: SpecBody,
    session: SessionDep,
    state: StateDep,
) -> BenchmarkRunOut:
    """Queue a run of `spec` (an `bench.BenchmarkSpec`: workload, geometry, runner,
    modes); a worker picks it up (`junction worker`). The stored spec has its defaults filled."""
    try:
        valid = validate_spec(spec)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        raise RequestValidationError(
            [{**error, "loc": ["body", *error["loc"]]} for error in errors]
        ) from exc
    broker_url = state.settings.broker_url
    try:
        run = benchmarks.submit_run(
            session,
            valid,
            valid["name"],
            lambda run_id, task_id: send_run(broker_url, run_id, task_id),
        )
    except BrokerUnavailable as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"{exc}; the run was not queued"
        ) from exc
    return BenchmarkRunOut.model_validate(run)


@router.get("", response_model=BenchmarkRunPage)
def list_benchmarks(
    session: SessionDep,
    run_status: Annotated[RunStatus | None, Query(alias="status")] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
) -> BenchmarkRunPage:
    """Newest first; `status` keeps the runs in that state."""
    total, rows = benchmarks.list_runs(session, run_status, limit, offset)
    return BenchmarkRunPage(
        total=total,
        offset=offset,
        limit=limit,
        runs=[BenchmarkRunOut.model_validate(row) for row in rows],
    )


@router.get("/suite", response_model=list[dict[str, Any]])
def get_suite() -> list[dict[str, Any]]:
    """The standard suite's specs (`bench.STANDARD_SUITE`, defaults filled in, as a run
    stores its spec): what the beat queues on its schedule, and the presets of a client's form.
    """
    return standard_suite()


@router.get(
    "/{run_id}",
    response_model=BenchmarkRunOut,
    responses={404: error("no benchmark run of that id")},
)
def get_benchmark(
    run_id: Annotated[int, Path(ge=1, le=MAX_INT64)], session: SessionDep
) -> BenchmarkRunOut:
    run = session.get(BenchmarkRun, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"benchmark run {run_id} not found")
    return BenchmarkRunOut.model_validate(run)
