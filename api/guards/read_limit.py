"""Ingest keeps priority over reads, and a consumer of events over heavy reads: `ReadLimit`,
a pure ASGI middleware.

Every read of the REST API (a GET under `/api/v1`) runs its query and builds its JSON in the
app's worker threads, holding the interpreter's lock while it does: fifty dashboards polling
the block table at once left the ingest socket, which decodes and commits frames in the same
process, waiting its turn (lag p99 16 s, 1,401 frames unacknowledged). So reads run at most
`max_concurrent_reads` at a time; the next ones wait their turn (in the event loop, costing
nothing), at most `max_waiting_reads` of them and for at most `read_wait_s`, after which they
are answered 503 with `Retry-After`.

A consumer following the stream (`GET /api/v1/events`, a short page) waited in that same queue
behind the block-table pages (13.6 s p99 beside 50 readers, in the issue), so event reads have
a lane of their own: `max_concurrent_event_reads` at a time, their own queue (as long, as
patient), never behind another kind of read. The ingest socket, `/healthz` and `/metrics`
never wait here, and the socket's own work runs on a thread limiter of its own
(`ingest_threads`), so the reads' cannot starve it of threads either.
"""

from __future__ import annotations

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.settings import Settings

READ_PREFIX = "/api/v1/"
EVENTS_PATH = "/api/v1/events"


class Lane:
    """Reads of one kind: at most `max_concurrent` run, at most `max_waiting` wait (each for
    at most `wait_s`); `setting` is the variable that sets `max_concurrent`, for the 503."""

    def __init__(self, max_concurrent: int, max_waiting: int, wait_s: float, setting: str) -> None:
        self.max_concurrent = max_concurrent
        self.max_waiting = max_waiting
        self.wait_s = wait_s
        self.setting = setting
        self._slots: anyio.Semaphore | None = None  # made in the event loop, on first use
        self._num_waiting = 0

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the read with `app` once a slot is free; a 503 when none comes."""
        if self._slots is None:
            self._slots = anyio.Semaphore(self.max_concurrent)
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            if self._num_waiting >= self.max_waiting:
                why = f"{self._num_waiting} reads are waiting already"
                await self._busy(why, scope, receive, send)
                return
            self._num_waiting += 1
            try:
                with anyio.move_on_after(self.wait_s) as waited:
                    await self._slots.acquire()
            finally:
                self._num_waiting -= 1
            if waited.cancelled_caught:
                await self._busy(f"no read slot for {self.wait_s:g} s", scope, receive, send)
                return
        try:
            await app(scope, receive, send)
        finally:
            self._slots.release()

    async def _busy(self, why: str, scope: Scope, receive: Receive, send: Send) -> None:
        detail = (
            f"the control plane is busy with reads ({why}); retry shortly, or raise "
            f"{self.setting} / JUNCTION_MAX_WAITING_READS"
        )
        response = JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})
        await response(scope, receive, send)


class ReadLimit:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        waiting, wait_s = settings.max_waiting_reads, settings.read_wait_s
        self.reads = Lane(
            settings.max_concurrent_reads, waiting, wait_s, "JUNCTION_MAX_CONCURRENT_READS"
        )
        self.event_reads = Lane(
            settings.max_concurrent_event_reads,
            waiting,
            wait_s,
            "JUNCTION_MAX_CONCURRENT_EVENT_READS",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_read = (
            scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and scope["path"].startswith(READ_PREFIX)
        )
        if not is_read:
            await self.app(scope, receive, send)
        elif scope["path"].rstrip("/") == EVENTS_PATH:
            await self.event_reads.run(self.app, scope, receive, send)
        else:
            await self.reads.run(self.app, scope, receive, send)
