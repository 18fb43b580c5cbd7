"""What the app does when it starts and stops: it joins the fleet of replicas
(`api.membership`:
its row and heartbeat, the listener for other replicas' commands; on SQLite, the lock that
keeps a second process out), starts the retention task (`api.retention`, which prunes on one
replica at a time), and at the end cancels both, leaves the fleet and closes its pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import membership as fleet
from api.retention import retention_loop
from api.state import AppState


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The lifespan of an app whose `state.junction` is its `AppState`."""
    state: AppState = app.state.junction
    await fleet.start(state)
    state.tasks.append(asyncio.create_task(retention_loop(state), name="retention"))
    try:
        yield
    finally:
        await fleet.stop(state)  # cancels every task of `state.tasks`
        state.db.dispose()
