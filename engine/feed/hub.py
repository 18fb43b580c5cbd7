"""The engine's side of the feed: `FeedHub` batches each step's key events into one delta for
every subscriber (engine thread); `FeedSink` is the engine's event sink that feeds it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from engine.cache.lookup import HitGeometry
from engine.events import (
    TIER_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    ListSink,
    RequestFinished,
)
from engine.feed.frames import (
    GROUP_INDEX,
    GROUP_NAMES,
    FeedDelta,
    FeedFinished,
    FeedHeartbeat,
    FeedHello,
    FeedLoad,
    FeedSnapshot,
    KeyChange,
    encode,
)
from engine.feed.subscriber import FeedSubscriber
from engine.scheduling.capacity import max_request_tokens

if TYPE_CHECKING:
    from engine.engine import Engine


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
            elif event.medium not in TIER_MEDIA:  # the feed announces the device's keys only
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
