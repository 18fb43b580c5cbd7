"""`Readiness`: whether the router holds every engine's index, and which engines it waits for.

A router keeps nothing on disk: a restarted one rebuilds each engine's index from the snapshot
its cache feed opens with (`router.engines.follow`). It serves as soon as one engine is up and
routes by what it has; until every engine is in, the fleet is `degraded` and says which engines
it waits for (connecting: no snapshot yet; down: its feed broke) and since when, and the log says
so once when routing turns degraded and once when every engine is in again. An engine that
stays down keeps the fleet degraded: that is what the fleet is.
"""

from __future__ import annotations

import asyncio
import logging
import time

from router.fleet import Fleet

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.1  # how often the watcher looks: the log's and `since`'s resolution
READY, DEGRADED, NO_ENGINE = "ready", "degraded", "no_engine"


class Readiness:
    """The fleet's status over its engines' feeds, from the router's start on."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.started = time.time()
        self.waiting_since: dict[str, float] = {}  # by engine URL: when it was last seen not up
        self.status: str | None = None  # as last observed
        self.ready_after_s: float | None = None  # router start to every engine in, the first time

    def observe(self) -> str:
        """The status now; a change from the last one observed is logged (this changes only
        what `Readiness` records, never the fleet)."""
        now = time.time()
        engines = self.fleet.engines.values()
        for engine in engines:
            if engine.is_up:
                self.waiting_since.pop(engine.url, None)
            else:  # one never up is waited for since the router started
                never_up = engine.num_snapshots == 0
                self.waiting_since.setdefault(engine.url, self.started if never_up else now)
        for url in set(self.waiting_since) - set(self.fleet.engines):
            del self.waiting_since[url]
        num_up = len(engines) - len(self.waiting_since)
        if num_up and not self.waiting_since:
            status = READY
        else:
            status = DEGRADED if num_up else NO_ENGINE
        if status != self.status:
            self._changed(status, now)
        self.status = status
        return status

    def _changed(self, status: str, now: float) -> None:
        if status == READY:
            if self.ready_after_s is None:
                self.ready_after_s = now - self.started
                log.warning(
                    "every engine is in (%d) %.2f s after the router started: routing ready",
                    len(self.fleet.engines),
                    self.ready_after_s,
                )
            else:
                log.warning("every engine is in again (%d): routing ready", len(self.fleet.engines))
        elif status == DEGRADED:
            log.warning("routing degraded, by the engines up: waiting for %s", self._names())
        elif self.status is not None:
            log.warning("no engine is up: routing nothing; waiting for %s", self._names())

    def _names(self) -> str:
        engines = self.fleet.engines
        return ", ".join(
            f"{(engines[url].engine_id or url)} ({engines[url].status})"
            for url in self.waiting_since
        )

    def view(self) -> dict:
        """`/fleet`'s fleet-level fields: `status`, the engines waited for, since when."""
        status = self.observe()
        waiting = [
            {
                "url": url,
                "engine_id": self.fleet.engines[url].engine_id,
                "status": self.fleet.engines[url].status,
                "since": since,
            }
            for url, since in self.waiting_since.items()
        ]
        return {
            "status": status,
            "waiting_for": waiting,
            "degraded_since": min((w["since"] for w in waiting), default=None),
            "ready_after_s": self.ready_after_s,
        }


async def watch(readiness: Readiness) -> None:
    """Observe the fleet for as long as the router serves, so the log says each change."""
    while True:
        readiness.observe()
        await asyncio.sleep(WATCH_EVERY_S)
