"""What one request sends back from the engine thread: token deltas, then a finish record.

The engine thread writes into a `RequestStream` only through `loop.call_soon_threadsafe`, so
the stream's queue is touched by its own event loop alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.request import Request


class RequestRejected(ValueError):
    """The engine refused the request (an empty prompt, more tokens than it can hold, ...)."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shut down, or crashed in a step): no output will come."""


@dataclass(frozen=True)
class FinishedRequest:
    """A request's record once it leaves the engine. `num_cached_tokens` is the hit length,
    `None` when the request finished before its lookup (aborted while waiting)."""

    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int | None
    hit_tokens_by_group: dict[str, int] = field(default_factory=dict)
    ttft_s: float | None = None
    e2e_s: float | None = None
    num_written_tokens: int = 0  # prompt tokens whose blocks it stored beyond its hit

    @classmethod
    def of(
        cls, request: Request, submitted_ts: float, abort_reason: str | None = None
    ) -> FinishedRequest:
        """`request`'s record, timed from `submitted_ts` (so TTFT counts the queue wait); an
        abort the server asked for reports the server's reason (`stop`: a stop string)."""
        reason = request.finish_reason or "abort"
        if reason == "abort" and abort_reason is not None:
            reason = abort_reason
        first_ts, finished_ts = request.first_token_ts, request.finished_ts or time.time()
        return cls(
            request_id=request.request_id,
            finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=len(request.output_token_ids),
            num_cached_tokens=request.num_cached_tokens,
            hit_tokens_by_group=dict(request.hit_tokens_by_group),
            ttft_s=first_ts - submitted_ts if first_ts is not None else None,
            e2e_s=finished_ts - submitted_ts,
            num_written_tokens=max(
                0,
                min(request.num_registered_tokens, request.num_prompt_tokens)
                - (request.num_cached_tokens or 0),
            ),
        )


@dataclass(frozen=True)
class RequestOutput:
    """The tokens a request produced since its last output; `finished` on the last one.
    `num_cached_tokens` is the hit length once the request has been looked up."""

    new_token_ids: list[int]
    finished: FinishedRequest | None = None
    num_cached_tokens: int | None = None


class RequestStream:
    """An async iterator over one request's outputs. Leaving `async with` before the last
    output aborts the request, so a cancelled consumer (a client that hung up) frees its
    blocks."""

    def __init__(
        self,
        request_id: str,
        loop: asyncio.AbstractEventLoop,
        abort: Callable[[str, str], None],
    ) -> None:
        self.request_id = request_id
        self._loop = loop
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.is_finished = False

    # -- engine thread side
    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand `item` to the stream's loop; a closed loop means nobody listens any more."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            pass

    # -- event loop side
    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.is_finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.is_finished = True
            raise item
        if item.finished is not None:
            self.is_finished = True
        return item

    def abort(self, reason: str = "abort") -> None:
        """Stop the request; its final record reports `reason` (e.g. `stop` for a stop string
        the server matched)."""
        if not self.is_finished:
            self.is_finished = True
            self._abort(self.request_id, reason)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.abort()
