"""Ingest keeps priority over reads: `ReadLimit`, a pure ASGI middleware.

Every read of the REST API (a GET under `/api/v1`) runs its query and builds its JSON in the
app's worker threads, holding the interpreter's lock while it does: fifty dashboards polling
the block table at once left the ingest socket, which decodes and commits frames in the same
process, waiting its turn (lag p99 16 s, 1,401 frames unacknowledged). So reads run at most
`max_concurrent_reads` at a time; the next ones wait their turn (in the event loop, costing
nothing), at most `max_waiting_reads` of them and for at most `read_wait_s`, after which they
are answered 503 with `Retry-After`. The ingest socket, `/healthz` and `/metrics` never wait
here, and the socket's own work runs on a thread limiter of its own (`ingest_threads`), so the
reads' cannot starve it of threads either.
"""

from __future__ import annotations

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.settings import Settings

READ_PREFIX = "/api/v1/"


class ReadLimit:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.max_concurrent = settings.max_concurrent_reads
        self.max_waiting = settings.max_waiting_reads
        self.wait_s = settings.read_wait_s
        self._slots: anyio.Semaphore | None = None  # made in the event loop, on first use
        self._num_waiting = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_read = (
            scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and scope["path"].startswith(READ_PREFIX)
        )
        if not is_read:
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = anyio.Semaphore(self.max_concurrent)
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            if self._num_waiting >= self.max_waiting:
                why = f"{self._num_waiting} reads are waiting already"
                await _busy(why, scope, receive, send)
                return
            self._num_waiting += 1
            try:
                with anyio.move_on_after(self.wait_s) as waited:
                    await self._slots.acquire()
            finally:
                self._num_waiting -= 1
            if waited.cancelled_caught:
                await _busy(f"no read slot for {self.wait_s:g} s", scope, receive, send)
                return
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()


async def _busy(why: str, scope: Scope, receive: Receive, send: Send) -> None:
    detail = (
        f"the control plane is busy with reads ({why}); retry shortly, or raise "
        "JUNCTION_MAX_CONCURRENT_READS / JUNCTION_MAX_WAITING_READS"
    )
    response = JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})
    await response(scope, receive, send)
