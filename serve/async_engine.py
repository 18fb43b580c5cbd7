"""`AsyncEngine`: the engine's step loop on one thread, its outputs handed to asyncio.

The `Engine` is not thread-safe, so every call on it happens on the loop thread. Requests,
aborts and queries arrive through a thread-safe queue; the thread blocks on that queue while
the engine is idle and steps while it has work. After each step it compares every in-flight
request's `output_token_ids` with what it has already sent and hands the new tokens to the
request's `RequestStream`, then a `FinishedRequest` once the engine marks it finished (by a
step, an abort, or the scheduler turning it away).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.engine import Engine
from engine.request import Request, RequestStatus, SamplingParams
from serve.request_stream import (
    EngineDeadError,
    FinishedRequest,
    RequestOutput,
    RequestRejected,
    RequestStream,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Submit:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    stream: RequestStream
    admitted: Future[None]
    submitted_ts: float
    checkpoint_offsets: tuple[int, ...] = ()
    cache_salt: str | None = None


@dataclass
class _Abort:
    request_id: str
    reason: str


@dataclass
class _Call:
    fn: Callable[[Engine], Any]
    result: Future[Any]


_STOP = object()


@dataclass
class _InFlight:
    request: Request
    stream: RequestStream
    submitted_ts: float  # when the caller submitted it: TTFT and e2e count the queue wait
    num_sent: int = 0
    abort_reason: str | None = None


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine  # read only immutable parts (configs) from other threads
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._in_flight: dict[str, _InFlight] = {}
        self._finish_listeners: list[Callable[[FinishedRequest], None]] = []
        self._lock = threading.Lock()  # orders "is it running?" against "it has stopped"
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.error: BaseException | None = None  # what killed the loop, if anything

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
                self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; requests still in flight get `EngineDeadError`. Idempotent."""
        with self._lock:
            thread, self._stopped = self._thread, True
            self._commands.put(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopped

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def add_finish_listener(self, listener: Callable[[FinishedRequest], None]) -> None:
        """Call `listener` on the engine thread with every finished request's record."""
        self._finish_listeners.append(listener)

    # ------------------------------------------------------------------ asyncio side
    async def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        request_id: str = "",
        checkpoint_offsets: Sequence[int] = (),
        cache_salt: str | None = None,
    ) -> RequestStream:
        """Submit a request; returns its stream once the engine has taken it.

        Raises `RequestRejected` when the engine refuses it, `EngineDeadError` when the loop
        is not running. Without a `request_id`, a unique one is made."""
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        stream = RequestStream(request_id, asyncio.get_running_loop(), self.abort)
        admitted: Future[None] = Future()
        self._send(
            _Submit(
                request_id,
                list(prompt_token_ids),
                sampling,
                stream,
                admitted,
                time.time(),
                tuple(checkpoint_offsets),
                cache_salt,
            )
        )
        await asyncio.wrap_future(admitted)
        return stream

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Abort a request from any thread; a finished or unknown id is ignored."""
        try:
            self._send(_Abort(request_id, reason))
        except EngineDeadError:
            pass

    def submit(self, fn: Callable[[Engine], T]) -> Future[T]:
        """Run `fn(engine)` on the engine thread from any thread; the future holds its result."""
        result: Future[T] = Future()
        self._send(_Call(fn, result))
        return result

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps (a snapshot, cache usage)."""
        result: Future[T] = Future()
        self._send(_Call(fn, result))
        return await asyncio.wrap_future(result)

    def _send(self, command: Any) -> None:
        with self._lock:
            if self._thread is None or self._stopped:
                raise EngineDeadError(self._dead_message())
            self._commands.put(command)

    def _dead_message(self) -> str:
        if self.error is not None:
            return f"the engine loop stopped after an error: {self.error!r}"
        if self._thread is None:
            return "the engine loop has not been started"
        return "the engine loop has shut down"

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            # what reached the step listeners before the loop ran: control-plane commands
            # queued while it was starting, events to publish
            self.engine.notify_listeners()
            while self._apply_commands(block=not self.engine.has_unfinished()):
                if self.engine.has_unfinished():
                    self.engine.step()
                self._deliver()
        except BaseException as exc:  # a bug or a broken runner: fail every waiter, loudly
            log.exception("engine loop crashed")
            self.error = exc
        finally:
            with self._lock:
                self._stopped = True
            dead = EngineDeadError(self._dead_message())
            for entry in self._in_flight.values():
                entry.stream.put(dead)
            self._in_flight.clear()
            self._fail_pending(dead)

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued commands, waiting for the first when `block`; False on stop."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, command: Any) -> None:
        if isinstance(command, _Submit):
            if not command.admitted.set_running_or_notify_cancel():
                return  # the caller was cancelled while waiting: never start its request
            try:
                request = self.engine.add_request(
                    command.prompt_token_ids,
                    command.sampling,
                    command.request_id,
                    checkpoint_offsets=command.checkpoint_offsets,
                    cache_salt=command.cache_salt,
                )
            except ValueError as exc:
                command.admitted.set_exception(RequestRejected(str(exc)))
                return
            except Exception as exc:
                command.admitted.set_exception(exc)
                return
            self._in_flight[request.request_id] = _InFlight(
                request, command.stream, command.submitted_ts
            )
            command.admitted.set_result(None)
        elif isinstance(command, _Abort):
            entry = self._in_flight.get(command.request_id)
            if entry is not None:
                entry.abort_reason = command.reason
                self.engine.abort(command.request_id)
        elif isinstance(command, _Call):
            if not command.result.set_running_or_notify_cancel():
                return
            try:
                command.result.set_result(command.fn(self.engine))
            except Exception as exc:
                command.result.set_exception(exc)

    def _fail_pending(self, dead: EngineDeadError) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            future = getattr(command, "admitted", None) or getattr(command, "result", None)
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(dead)

    def _deliver(self) -> None:
        for request_id, entry in list(self._in_flight.items()):
            request = entry.request
            new_token_ids = request.output_token_ids[entry.num_sent :]
            entry.num_sent += len(new_token_ids)
            if request.status is not RequestStatus.FINISHED:
                if new_token_ids:
                    entry.stream.put(RequestOutput(new_token_ids, None, request.num_cached_tokens))
                continue
            del self._in_flight[request_id]
            record = FinishedRequest.of(request, entry.submitted_ts, entry.abort_reason)
            for listener in self._finish_listeners:
                try:
                    listener(record)
                except Exception:
                    log.exception("finish listener failed on %s", request_id)
            entry.stream.put(RequestOutput(new_token_ids, record, request.num_cached_tokens))
