"""What the OpenAPI schema says beyond what FastAPI derives from the routes: what a route may
answer besides its success, the error bodies the app really sends, and the rules the app's
guards hold every parameter to.

A client (and the contract test, `tests/api/test_openapi_contract.py`) reads the schema to
learn what it may send and be answered; a status code missing from it is a surprise, and so
is a schema-valid request refused. The shared codes come from the app's guards, whatever the
route: the token checks (`api.deps`), the NUL check of every parameter, the store's
reachability and the read limit (`api.guards`), and the body limits of the routes that take a
body. Each route adds its own (404, 409, ...) in its `responses=`; a route's description of a
code wins over the shared one.

`install(app)` adds to the app what the routes alone cannot say:

- every string parameter declares that it holds no NUL character (`refuse_nul_parameters`
  answers one with a 422: PostgreSQL's text cannot keep it);
- a 405 names in `Allow` every method of its path: Starlette names only those of the first
  route whose path matched (each method is a route of its own), so `OPTIONS /api/v1/pins`
  said `Allow: POST`, hiding the `GET` beside it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import compile_path


class ErrorOut(BaseModel):
    """Every refusal but a failed validation: `detail` says what is wrong and what to do."""

    detail: str


class FieldError(BaseModel):
    """One reason a request failed validation: where (`loc`, e.g. `["body", "prefix"]`), what
    (`type`, `msg`), and the value refused (`input`, a short preview of a long one)."""

    type: str = ""
    loc: list[str | int] = []
    msg: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class ValidationErrorOut(BaseModel):
    """A 422: the request's fields that failed validation (a list, with `message` saying them
    one line a problem), or, for a request that validated but cannot be done as asked, one
    sentence saying why."""

    message: str | None = None
    detail: list[FieldError] | str


def error(description: str, model: type[BaseModel] = ErrorOut) -> dict[str, Any]:
    """One entry of a route's `responses=`: the body `model`, the case `description`."""
    return {"model": model, "description": description}


#: Every route under `/api/v1` (`api.main` adds them to each router it includes).
API_ERRORS = {
    401: error("no bearer token, or one the control plane does not have"),
    422: error(
        "a parameter or the body is not valid (a NUL character in any of them is refused)",
        ValidationErrorOut,
    ),
    503: error(
        "the store's database is unreachable, or (reads) too many reads wait already: "
        "nothing was written; retry after `Retry-After` seconds"
    ),
}
#: Every write (a route that takes `RequireWrite`).
WRITE_ERRORS = {403: error("the read-only token (JUNCTION_READ_TOKEN) cannot write")}
#: Every route that takes a body, on top of `WRITE_ERRORS`.
BODY_ERRORS = {
    408: error("no part of the body came in JUNCTION_BODY_TIMEOUT_S seconds"),
    413: error(
        "the body is over the route's limit (JUNCTION_MAX_BODY_BYTES, for pins "
        "JUNCTION_MAX_PIN_BODY_BYTES)"
    ),
}
#: The routes of one engine (`{engine_id}` in the path).
ENGINE_NOT_FOUND = {404: error("no engine of that id")}
#: `/healthz` and `/metrics`: no token, but their parameters are checked like every route's.
OPEN_ERRORS = {422: API_ERRORS[422]}


#: A string without a NUL character (`\u0000`), as a JSON Schema pattern.
NO_NUL = "^[^\\u0000]*$"


def install(app: FastAPI) -> None:
    """The schema's NUL rule and the 405s' `Allow` header (see the module's docstring)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema["paths"].values():
                for operation in operations.values():
                    for parameter in operation.get("parameters", []):
                        _without_nul(parameter["schema"])
        return app.openapi_schema

    app.openapi = openapi
    app.add_exception_handler(HTTPException, _with_allow)


def _without_nul(schema: dict[str, Any]) -> None:
    """Adds `NO_NUL` to each free string of a parameter's `schema` (an enum or a pattern of
    its own says more already)."""
    for branch in schema.get("anyOf", []):
        _without_nul(branch)
    if schema.get("type") == "string" and "enum" not in schema and "pattern" not in schema:
        schema["pattern"] = NO_NUL


async def _with_allow(request: Request, exc: HTTPException):
    """A 405 on a path of the schema lists in `Allow` each method the schema gives the path;
    the other refusals are answered as FastAPI answers them."""
    if exc.status_code == 405:
        path = request.url.path
        methods = {
            method.upper()
            for template, operations in request.app.openapi()["paths"].items()
            if compile_path(template)[0].match(path)
            for method in operations
        }
        if methods:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
    return await http_exception_handler(request, exc)
