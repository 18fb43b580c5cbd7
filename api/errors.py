"""What the API answers when its database is unreachable: 503 with the reason, not a 500.

A lost connection (PostgreSQL restarting, a network partition) surfaces from SQLAlchemy as an
`OperationalError` or `InterfaceError` (psycopg's and sqlite3's connection errors, wrapped) or
as a `DBAPIError` whose connection was invalidated. The request's transaction was rolled back,
so nothing half-written stays; the client may retry once the store is back.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

log = logging.getLogger(__name__)


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


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DBAPIError, _unavailable)
