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
    FeedRates,
    FeedSnapshot,
    KeyChange,
    TierChange,
    encode,
)
from engine.feed.subscriber import FeedSubscriber
from engine.scheduling.capacity import max_request_tokens
from engine.tiers.index import UnitIndex

if TYPE_CHECKING:
    from engine.engine import Engine


def engine_load(engine: Engine) -> FeedLoad:
    """The engine's queue and memory now, and its measured rates (engine thread)."""
    rates = engine_rates(engine)
    scheduler = engine.scheduler
    remaining = 0
    for request in (*scheduler.running, *scheduler.waiting):
        if request.is_prefilling:
            remaining += request.prefill_target - request.num_computed_tokens
    pools = scheduler.coordinator.pools
    usage = [1 - pool.num_free / pool.num_blocks for pool in pools.values()]
    return FeedLoad(len(scheduler.running), len(scheduler.waiting), remaining, *usage, rates)


def engine_rates(engine: Engine) -> FeedRates | None:
    """The rates the engine measured to price its tier loads (`Engine.price_tier_loads`);
    None before, or where it measured none. The shared tier's rate and entries' TTL are the
    stack's `shared` tier's, where it has one."""
    tiering = engine.scheduler.tiering
    costs = None if tiering is None else tiering.costs
    if costs is None:
        return None
    shared = tiering.shared
    return FeedRates(
        costs.prefill_tokens_per_s,
        costs.host_bytes_per_s,
        costs.disk_bytes_per_s if tiering.stack.disk is not None else None,
        (costs.shared_bytes_per_s or costs.disk_bytes_per_s) if shared is not None else None,
        None if shared is None else shared.ttl_s,
        None if shared is None else shared.is_up,
    )


def _tier_indexes(engine: Engine) -> list[tuple[str, object]]:
    """This engine's tiers below the device with their `UnitIndex`: host and disk (the shared
    store's units reach routers as this engine puts them, in deltas: a snapshot has none)."""
    tiering = engine.scheduler.tiering
    if tiering is None:
        return []
    stack = tiering.stack
    tiers = [(medium, getattr(stack, attr, None)) for medium, attr in _TIER_ATTRS]
    return [(m, t.index) for m, t in tiers if isinstance(getattr(t, "index", None), UnitIndex)]


_TIER_ATTRS = (("host", "host"), ("disk", "disk"))


def tier_units(engine: Engine) -> list[TierChange]:
    """Every unit the tiers hold now, as stores (a snapshot's)."""
    return [
        TierChange("store", medium, key, r.parent, r.start, r.end, r.num_bytes)
        for medium, index in _tier_indexes(engine)
        for key, r in index.records.items()  # type: ignore[attr-defined]
    ]


def tier_change(engine: Engine, event: BlockStored | BlockRemoved) -> TierChange | None:
    """The feed's word for a tier event (one per unit: the attention group's), None for a
    malformed one (it is the engine's own: never worth taking the feed down for)."""
    if event.group_idx != 0 or len(event.block_hashes) != 1:
        return None
    key = bytes.fromhex(event.block_hashes[0])
    if type(event) is BlockRemoved:
        return TierChange("remove", event.medium, key)  # type: ignore[arg-type]
    parent = event.parent_block_hash
    start, end = event.token_range
    index = dict(_tier_indexes(engine)).get(event.medium)
    record = None if index is None else index.records.get(key)  # type: ignore[attr-defined]
    num_bytes = 0 if record is None else record.num_bytes
    if event.medium == "shared" and engine.scheduler.tiering is not None:
        shared = engine.scheduler.tiering.shared  # the store's entry, as this engine put it
        num_bytes = 0 if shared is None else shared.known.get(key, 0)
    try:
        return TierChange(
            "store",
            event.medium,  # type: ignore[arg-type]
            key,
            None if parent is None else bytes.fromhex(parent),
            start,
            end,
            num_bytes,
        )
    except ValueError:
        return None


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
        self.engine: Engine | None = None

    def attach(self, engine: Engine, model_name: str | None = None) -> None:
        """Follow `engine` (built with this hub's `FeedSink`) before it steps; `model_name` is
        the name its server answers to (default: the model config's)."""
        self.engine_id, self.epoch = engine.engine_id, engine.epoch
        self.model_name = model_name or engine.model_config.name
        self.geometry = HitGeometry.of(engine.cache_config)
        self.engine = engine
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
        tiers: list[TierChange] = []
        finished: list[FeedFinished] = []
        for event in self.pending:
            if type(event) is RequestFinished:
                finished.append(
                    FeedFinished(event.request_id, event.num_prompt_tokens, event.num_cached_tokens)
                )
            elif type(event) is AllBlocksCleared:
                groups = GROUP_NAMES if event.group is None else (event.group,)
                changes.extend(KeyChange("clear", GROUP_INDEX[g], []) for g in groups)
            elif event.medium not in TIER_MEDIA:  # a device block
                op = "store" if type(event) is BlockStored else "remove"
                keys = [bytes.fromhex(k) for k in event.block_hashes]
                changes.append(KeyChange(op, GROUP_INDEX[event.group], keys))
            elif self.engine is not None and (change := tier_change(self.engine, event)):
                tiers.append(change)  # a unit a tier below the device stored or gave up
        self.pending.clear()
        self.seq += 1
        frame = encode(FeedDelta(self.seq, changes, finished, self.load, tiers))
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
            tier_units(engine),
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
