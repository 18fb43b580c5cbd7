"""The cache feed: which keys an engine's two groups hold, streamed to routers.

A router predicts the hit a request would get on each engine by running the engine's own lookup
rule (`engine.cache.lookup`) over the keys that engine holds. The feed tells it those keys:

1. `FeedHello` once: the engine, its epoch and the lookup geometry (for a bridged vLLM or
   SGLang engine, whose feed `junction attach --feed-port` serves, also where its requests go
   and that no finished requests are reported: `engine.bridge.peer_feed`).
2. `FeedSnapshot` once: every key each group holds now, at seq `seq`.
3. `FeedDelta` after each step that changed something, seq rising by one: the keys stored and
   removed in the order the cache did it, the requests that finished, and the engine's load.
4. `FeedHeartbeat` while nothing changes (every `HEARTBEAT_S`), with the load.

A subscriber that cannot keep up is closed, not slowed down: it reconnects and starts again
from a snapshot. Keys are the raw 16-byte chained hashes (`engine.hashing`), frames msgpack.

`FeedSink` is the engine's event sink when it serves a feed: it keeps the events for a control
plane's publisher only when there is one (else nothing would drain them), and hands the key
events to the `FeedHub`, which batches them per step on the engine's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import msgspec
from msgspec import Struct

from engine.cache.lookup import HitGeometry
from engine.capacity import max_request_tokens
from engine.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    ListSink,
    RequestFinished,
)

if TYPE_CHECKING:
    from engine.engine import Engine

HEARTBEAT_S = 0.5
# `WS /v1/cache/feed`'s close codes, whoever serves it
CLOSE_UNAUTHORIZED = 4401  # a missing or wrong bearer token
CLOSE_NO_TOKEN = 4403  # the server has no token, so it serves no feed
CLOSE_FELL_BEHIND = 1013  # reconnect: a new connection starts from a snapshot
CLOSE_ENGINE_DEAD = 1011
#: Frames one subscriber may have waiting; past it the subscriber is dropped (it resyncs).
MAX_PENDING_FRAMES = 4096
GROUP_INDEX = {"attention": 0, "mamba": 1}
GROUP_NAMES = ("attention", "mamba")


class FeedLoad(Struct, frozen=True, array_like=True):
    num_running: int
    num_waiting: int
    num_prefill_tokens: int  # prompt tokens admitted or queued and not yet computed
    attention_usage: float  # share of the group's blocks held by requests or pins
    mamba_usage: float


class FeedFinished(Struct, frozen=True, array_like=True):
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int


class KeyChange(Struct, frozen=True, array_like=True):
    op: Literal["store", "remove", "clear"]
    group: int  # 0 attention, 1 mamba
    keys: list[bytes]


class FeedHello(Struct, frozen=True, tag="hello"):
    engine_id: str
    epoch: int
    geometry: HitGeometry
    model: str
    max_request_tokens: int  # the most prompt + output tokens one request may hold
    # the OpenAI base URL requests go to, when someone else than the engine serves the feed
    # (`junction attach --feed-port`: the peer's `--serve-url`); None: the feed's own host
    serve_url: str | None = None
    # whether deltas name the requests that finished (a peer's events carry no request ids)
    reports_finished: bool = True


class FeedSnapshot(Struct, frozen=True, tag="snapshot"):
    seq: int
    attention: list[bytes]
    mamba: list[bytes]
    load: FeedLoad


class FeedDelta(Struct, frozen=True, tag="delta"):
    seq: int
    changes: list[KeyChange]
    finished: list[FeedFinished]
    load: FeedLoad


class FeedHeartbeat(Struct, frozen=True, tag="heartbeat"):
    seq: int  # the last delta's seq
    load: FeedLoad


FeedFrame = FeedHello | FeedSnapshot | FeedDelta | FeedHeartbeat
encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(FeedFrame)


def decode(data: bytes) -> FeedFrame:
    """One frame; `msgspec.ValidationError` or `DecodeError` for a bad one."""
    return _decoder.decode(data)


def engine_load(engine: Engine) -> FeedLoad:
    """The engine's queue and memory now (engine thread)."""
    scheduler = engine.scheduler
    remaining = 0
    for request in (*scheduler.running, *scheduler.waiting):
        if request.is_prefilling:
            remaining += request.prefill_target - request.num_computed_tokens
    pools = scheduler.coordinator.pools
    usage = [1 - pool.num_free / pool.num_blocks for pool in pools.values()]
    return FeedLoad(len(scheduler.running), len(scheduler.waiting), remaining, *usage)


class FeedSubscriber:
    """One router's end of the feed. `push` runs on the engine thread and calls `wake` (which
    must be thread-safe: `loop.call_soon_threadsafe(event.set)`); the reader calls `take`."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.lock = threading.Lock()
        self.frames: list[bytes] = []
        self.is_closed = False  # fell behind, or unsubscribed: the reader resyncs or is gone

    def push(self, frame: bytes) -> None:
        with self.lock:
            if self.is_closed:
                return
            if len(self.frames) >= MAX_PENDING_FRAMES:
                self.is_closed = True
                self.frames = []
            else:
                self.frames.append(frame)
        self.wake()

    def take(self) -> list[bytes]:
        """The frames pushed so far, oldest first."""
        with self.lock:
            frames, self.frames = self.frames, []
        return frames


def bearer_token(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` header's value; "" for any other."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def loop_subscriber() -> tuple[FeedSubscriber, asyncio.Event]:
    """A subscriber whose pushes, from any thread, set an event of the running loop."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    return FeedSubscriber(lambda: loop.call_soon_threadsafe(ready.set)), ready


async def relay(
    first: list[bytes],
    subscriber: FeedSubscriber,
    ready: asyncio.Event,
    send: Callable[[bytes], Awaitable[None]],
    heartbeat: Callable[[], bytes],
) -> None:
    """Send `first` (the hello and snapshot), then the frames pushed to `subscriber` as they
    come, and `heartbeat()` every `HEARTBEAT_S` while none does. Returns once the subscriber
    is closed (it fell behind, or the feed dropped it); a failed `send` raises."""
    for frame in first:
        await send(frame)
    while True:
        try:
            await asyncio.wait_for(ready.wait(), HEARTBEAT_S)
        except TimeoutError:
            await send(heartbeat())
            continue
        ready.clear()
        for frame in subscriber.take():
            await send(frame)
        if subscriber.is_closed:
            return


class FeedHub:
    """Batches each step's key events into one delta for every subscriber (engine thread)."""

    def __init__(self) -> None:
        self.engine_id, self.epoch, self.model_name = "", 0, ""
        self.geometry: HitGeometry | None = None
        self.seq = 0
        self.pending: list[CacheEvent] = []
        self.subscribers: list[FeedSubscriber] = []
        self.lock = threading.Lock()  # guards `subscribers` against `unsubscribe`
        self.load: FeedLoad = FeedLoad(0, 0, 0, 0.0, 0.0)

    def attach(self, engine: Engine, model_name: str | None = None) -> None:
        """Follow `engine` (built with this hub's `FeedSink`) before it steps; `model_name` is
        the name its server answers to (default: the model config's)."""
        self.engine_id, self.epoch = engine.engine_id, engine.epoch
        self.model_name = model_name or engine.model_config.name
        self.geometry = HitGeometry.of(engine.cache_config)
        engine.step_listeners.append(self.on_step)

    # ------------------------------------------------------------------ engine thread
    def tap(self, event: CacheEvent) -> None:
        if self.subscribers and type(event) in _KEY_EVENTS:
            self.pending.append(event)

    def on_step(self, engine: Engine) -> None:
        if not self.subscribers:  # no one reads the load or the keys: the step pays nothing
            self.pending.clear()
            return
        self.load = engine_load(engine)
        self._publish()

    def _publish(self) -> None:
        if not self.pending:
            return
        changes: list[KeyChange] = []
        finished: list[FeedFinished] = []
        for event in self.pending:
            if type(event) is RequestFinished:
                finished.append(
                    FeedFinished(event.request_id, event.num_prompt_tokens, event.num_cached_tokens)
                )
            elif type(event) is AllBlocksCleared:
                groups = GROUP_NAMES if event.group is None else (event.group,)
                changes.extend(KeyChange("clear", GROUP_INDEX[g], []) for g in groups)
            else:
                op = "store" if type(event) is BlockStored else "remove"
                keys = [bytes.fromhex(k) for k in event.block_hashes]
                changes.append(KeyChange(op, GROUP_INDEX[event.group], keys))
        self.pending.clear()
        self.seq += 1
        frame = encode(FeedDelta(self.seq, changes, finished, self.load))
        with self.lock:
            self.subscribers = [s for s in self.subscribers if not s.is_closed]
            for subscriber in self.subscribers:
                subscriber.push(frame)

    def subscribe(self, engine: Engine, subscriber: FeedSubscriber) -> list[bytes]:
        """The hello and snapshot frames for a new subscriber, who then gets every delta after
        it; call on the engine thread, between steps."""
        if self.geometry is None:
            raise RuntimeError("the feed hub is not attached to an engine")
        self._publish()  # events since the last step belong to the subscribers before
        coordinator = engine.scheduler.coordinator
        self.load = engine_load(engine)  # heartbeats carry it until the next step
        snapshot = FeedSnapshot(
            self.seq,
            list(coordinator.attention.pool.entries),
            list(coordinator.mamba.pool.entries),
            self.load,
        )
        hello = FeedHello(
            self.engine_id,
            self.epoch,
            self.geometry,
            self.model_name,
            max_request_tokens(
                engine.cache_config,
                engine.scheduler_config.max_model_len,
                coordinator.pools,
                len(engine.pins),
            ),
        )
        with self.lock:
            self.subscribers.append(subscriber)
        return [encode(hello), encode(snapshot)]

    def unsubscribe(self, subscriber: FeedSubscriber) -> None:
        subscriber.is_closed = True
        with self.lock:
            self.subscribers = [s for s in self.subscribers if s is not subscriber]

    def heartbeat(self) -> bytes:
        return encode(FeedHeartbeat(self.seq, self.load))


_KEY_EVENTS = frozenset({BlockStored, BlockRemoved, AllBlocksCleared, RequestFinished})


class FeedSink(ListSink):
    """The engine's sink when it serves a feed: events go to `hub`, and are kept for a
    publisher's `drain` only when `keep_events` (no publisher: nothing would drain them)."""

    def __init__(self, hub: FeedHub, keep_events: bool) -> None:
        super().__init__()
        self.hub = hub
        self.keep_events = keep_events

    def emit(self, event: CacheEvent) -> None:
        if self.keep_events:
            self.events.append(event)
        self.hub.tap(event)
