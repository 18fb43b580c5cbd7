"""What the API answers for a store it cannot reach (503, not a 500) and for a request that
fails validation (422, its inputs cut short).

A lost connection (PostgreSQL restarting, a network partition) surfaces from SQLAlchemy as an
`OperationalError` or `InterfaceError` (psycopg's and sqlite3's connection errors, wrapped) or
as a `DBAPIError` whose connection was invalidated. The request's transaction was rolled back,
so nothing half-written stays; the client may retry once the store is back.

FastAPI's own 422 echoes each error's `input` (and `ctx`) whole: a 25M-element `token_ids`
came back as 52 MB, after seconds of encoding on the event loop, and an input it cannot encode
(`1e999999` decodes to an infinite float, `"\\ud800"` has no UTF-8) made it a 500. Here an
input is kept when it is small, else replaced by a short preview (`PREVIEW_CHARS`); large
`ctx` values are dropped; strings are made encodable; at most `MAX_ERRORS` errors are listed.
The work is bounded by those sizes, not by the input's.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from api.guards.problems import problems_message

log = logging.getLogger(__name__)
PREVIEW_CHARS = 200
MAX_ERRORS = 20


def is_store_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not be reached (rather than refused the query)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def store_unavailable_message(exc: BaseException) -> str:
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = cause[0] if cause else type(exc).__name__
    return f"the store's database is unreachable ({first}); nothing was written, retry later"


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    if not is_store_unavailable(exc):
        raise exc
    log.warning("%s %s: %s", request.method, request.url.path, store_unavailable_message(exc))
    return JSONResponse(
        {"detail": store_unavailable_message(exc)},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "5"},
    )


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """`message`, one line per problem for a person (`api.guards.problems`), and `detail`,
    pydantic's list made small, for programs."""
    errors = exc.errors()
    detail = [brief_error(error) for error in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        more = f"and {len(errors) - MAX_ERRORS} more errors, not listed"
        detail.append({"type": "too_many_errors", "loc": [], "msg": more})
    body = {"message": problems_message(detail), "detail": detail}
    return JSONResponse(body, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def brief_error(error: Any) -> dict[str, Any]:
    """A validation error as FastAPI lists it, with its `input` short and every value
    JSON-encodable (`ctx` values that are not short scalars are left out)."""
    if not isinstance(error, dict):
        return {"msg": _text(str(error))}
    out: dict[str, Any] = {
        "type": str(error.get("type", "")),
        "loc": [part if isinstance(part, int) else _text(str(part)) for part in error["loc"]],
        "msg": _text(str(error.get("msg", "")), 4 * PREVIEW_CHARS),
    }
    if "input" in error:
        out["input"] = preview(error["input"])
    ctx = {key: _scalar(value) for key, value in (error.get("ctx") or {}).items()}
    ctx = {key: value for key, value in ctx.items() if value is not None}
    if ctx:
        out["ctx"] = ctx
    return out


def preview(value: Any) -> Any:
    """`value` itself when it is a finite number or a short plain JSON value; else a string
    of about `PREVIEW_CHARS` characters at most, saying what it was (read in bounded time:
    a few items at each of the first levels)."""
    try:
        return _copy_small(value, [PREVIEW_CHARS], 0)
    except _TooBig:
        pass
    if isinstance(value, str):
        return f"{_text(value)}... ({len(value)} characters)"
    if isinstance(value, bytes):
        return f"{_text(value[:PREVIEW_CHARS].decode('utf-8', 'replace'))}... ({len(value)} bytes)"
    size = f" ({len(value)} items)" if isinstance(value, list | tuple | dict) else ""
    return _text(_sketch(value, 0)) + size


def _sketch(value: Any, depth: int) -> str:
    if isinstance(value, dict | list | tuple) and depth >= 2:
        return "{...}" if isinstance(value, dict) else "[...]"
    if isinstance(value, dict):
        items = [f"{_sketch(k, depth + 1)}: {_sketch(v, depth + 1)}" for k, v in _first(value)]
        return "{" + ", ".join(items) + (", ...}" if len(value) > len(items) else "}")
    if isinstance(value, list | tuple):
        items = [_sketch(item, depth + 1) for item in _first(value)]
        return "[" + ", ".join(items) + (", ...]" if len(value) > len(items) else "]")
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, int) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    return repr(value)[:40]


def _first(items: Any, num: int = 8) -> list[Any]:
    return list(itertools.islice(items.items() if isinstance(items, dict) else items, num))


class _TooBig(Exception):
    pass


def _copy_small(value: Any, budget: list[int], depth: int) -> Any:
    """A JSON-encodable copy of `value`, or `_TooBig` once it costs more than `budget`."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 4:
        raise _TooBig
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int):
        budget[0] -= value.bit_length() // 3
        if budget[0] < 0:
            raise _TooBig
        return value
    if isinstance(value, str):
        budget[0] -= len(value)
        if budget[0] < 0:
            raise _TooBig
        return _encodable(value)
    if isinstance(value, dict):
        if len(value) > budget[0]:
            raise _TooBig
        return {
            _copy_small(str(k), budget, depth + 1): _copy_small(v, budget, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        if len(value) > budget[0]:
            raise _TooBig
        return [_copy_small(item, budget, depth + 1) for item in value]
    raise _TooBig


def _scalar(value: Any) -> Any:
    """A `ctx` value worth keeping (a finite number, a short string), else None."""
    if isinstance(value, bool | int) and abs(value) < 2**64:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    text = str(value) if isinstance(value, str | Exception) else None
    return _encodable(text) if text is not None and len(text) <= PREVIEW_CHARS else None


def _text(text: str, limit: int = PREVIEW_CHARS) -> str:
    return _encodable(text[:limit])


def _encodable(text: str) -> str:
    """`text` with anything UTF-8 cannot encode (lone surrogates) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DBAPIError, _unavailable)
    app.add_exception_handler(RequestValidationError, _invalid)
