"""What the app does when it starts and stops: engines it finds marked connected are not
(nothing is connected to an app that is starting), and its database pool closes at the end."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from api import engines
from api.state import AppState

log = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The lifespan of an app whose `state.junction` is its `AppState`."""
    state: AppState = app.state.junction
    forget_connections(state)
    yield
    state.db.dispose()


def forget_connections(state: AppState) -> None:
    """Clear what a previous run that stopped without saying goodbye left marked connected."""
    try:
        with state.sessions() as session, session.begin():
            engines.mark_all_disconnected(session)
    except SQLAlchemyError as exc:
        log.warning(
            "could not reset the engines' connected flags (is the schema migrated?): %s", exc
        )
