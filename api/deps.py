"""Route dependencies as `Annotated` aliases: the app state, a session, the token check."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Query, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from api.models import Engine
from api.state import AppState


def get_state(connection: HTTPConnection) -> AppState:
    return connection.app.state.junction


StateDep = Annotated[AppState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    with state.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def is_valid_token(state: AppState, token: str | None) -> bool:
    if token is None:
        return False
    return secrets.compare_digest(token.encode(), state.settings.api_token.encode())


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


_bearer = HTTPBearer(auto_error=False, description="JUNCTION_API_TOKEN")


def require_token(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token (Authorization: Bearer <JUNCTION_API_TOKEN>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not is_valid_token(state, credentials.credentials):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "wrong bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


#: Writes take `_: RequireToken`; reads are open.
RequireToken = Annotated[None, Depends(require_token)]


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
