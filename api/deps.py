"""Route dependencies as `Annotated` aliases: the app state, a session, the token checks."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Query, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from api.guards.token import MISSING_WRITE_TOKEN
from api.state import AppState
from api.store.models import Engine


async def get_state(connection: HTTPConnection) -> AppState:
    """A coroutine, as it never blocks: no worker thread for it (`/healthz` takes none)."""
    return connection.app.state.junction


StateDep = Annotated[AppState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    with state.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def is_valid_token(state: AppState, token: str | None) -> bool:
    """Whether `token` is the write token (a control plane without one accepts none)."""
    return _matches(token, state.settings.api_token)


def is_read_token(state: AppState, token: str | None) -> bool:
    """Whether `token` is the read-only token (a control plane without one accepts none)."""
    return _matches(token, state.settings.read_token)


def _matches(token: str | None, expected: str | None) -> bool:
    if not token or not expected:
        return False
    return secrets.compare_digest(token.encode(), expected.encode())


_bearer = HTTPBearer(
    auto_error=False, description="JUNCTION_API_TOKEN (or, for reads, JUNCTION_READ_TOKEN)"
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"}
    )


def require_read(state: StateDep, credentials: Credentials) -> None:
    """A read: the write token or the read-only token."""
    if credentials is None:
        raise _unauthorized(
            "missing bearer token (Authorization: Bearer <JUNCTION_API_TOKEN or "
            "JUNCTION_READ_TOKEN>)"
        )
    token = credentials.credentials
    if not (is_valid_token(state, token) or is_read_token(state, token)):
        raise _unauthorized("wrong bearer token")


def require_write(state: StateDep, credentials: Credentials) -> None:
    """A write: the write token only; the read-only token is a 403."""
    if credentials is None:
        raise _unauthorized(MISSING_WRITE_TOKEN)
    token = credentials.credentials
    if is_valid_token(state, token):
        return
    if is_read_token(state, token):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "the read-only token (JUNCTION_READ_TOKEN) cannot write: send JUNCTION_API_TOKEN",
        )
    raise _unauthorized("wrong bearer token")


#: Every REST router takes `dependencies=[READ]`, so no route of it (not even a lookup of its
#: path's resource) runs without a token; writes take `_: RequireWrite` before any other
#: parameter, so a wrong token is refused before the path's resource is looked up.
READ = Depends(require_read)
RequireWrite = Annotated[None, Depends(require_write)]


def get_engine(engine_id: str, session: SessionDep) -> Engine:
    """The `{engine_id}` of the path, or a 404 that names it."""
    engine = session.get(Engine, engine_id)
    if engine is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"engine {engine_id!r} not found")
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]

# The store's integers are signed 64-bit: a larger offset, seq or id cannot name a row, and
# would fail in the driver (a 500) rather than find nothing.
MAX_INT64 = 2**63 - 1
Offset = Annotated[int, Query(ge=0, le=MAX_INT64, description="rows to skip")]
