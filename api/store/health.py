"""The store's health for `/healthz`, checked off the readers' path.

`/healthz` ran in the worker threads the REST routes share and took a connection from their
pool, so beside 50 REST readers a balancer's health check waited behind them (6 s in the
issue) and could mark a working replica down. `HealthCheck` runs `SELECT 1` in a worker
thread of its own (its own limiter: the shared pool's threads may all be busy), at most once
every `max_age_s`: the checks that come meanwhile get the last answer, and those that come
while a check runs wait for that one instead of starting theirs.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import anyio
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)
MAX_AGE_S = 0.5  # a balancer checks every second or so: each check sees a fresh answer


class StoreHealth(NamedTuple):
    is_ok: bool
    database: str  # the dialect's name, or "error: <the exception's type>"


class HealthCheck:
    """One check of the store at a time, its answer kept `max_age_s` seconds."""

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self.num_checks = 0  # the checks that reached the database
        self._last: StoreHealth | None = None
        self._checked_at = -math.inf  # time.monotonic() of `_last`
        self._lock: anyio.Lock | None = None  # made in the event loop, on first use
        self._thread: anyio.CapacityLimiter | None = None

    async def check(self, db: Engine) -> StoreHealth:
        """The store's health, at most `max_age_s` old. Runs in the event loop; the query
        runs in this check's own worker thread."""
        if self._is_fresh():
            return self._last
        if self._lock is None:
            self._lock, self._thread = anyio.Lock(), anyio.CapacityLimiter(1)
        async with self._lock:  # one check at a time: the others wait for its answer
            if not self._is_fresh():
                self._last = await anyio.to_thread.run_sync(self._query, db, limiter=self._thread)
                self._checked_at = time.monotonic()
        return self._last

    def _is_fresh(self) -> bool:
        return self._last is not None and time.monotonic() - self._checked_at < self.max_age_s

    def _query(self, db: Engine) -> StoreHealth:
        self.num_checks += 1
        try:
            with db.connect() as connection:
                connection.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            log.error("health check: database unreachable: %s", exc)
            return StoreHealth(False, f"error: {type(exc).__name__}")
        return StoreHealth(True, db.dialect.name)
