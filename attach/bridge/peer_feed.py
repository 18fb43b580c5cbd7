"""`PeerFeed`: a bridged peer's cache feed, in the frames `engine.feed` declares, from the
bridge's events.

The bridge's thread hands it every batch it translated (`on_events`); a server's threads
subscribe (`subscribe`: the hello and the snapshot, then every delta) with the engine's own
`FeedSubscriber`, so a subscriber `MAX_PENDING_FRAMES` behind is closed and resyncs, as an
engine's is. At most `max_subscribers` follow at once.

The hello says where requests go (`serve_url`: the peer's own OpenAI server) and that deltas
name no finished requests (`reports_finished=False`: a peer's events carry no request ids).
The geometry is learned from the blocks (`FeedKeys.geometry`); when it changes (the first
blocks, a Mamba group seen, a block size that changes the unit) the feed starts a new epoch:
every subscriber is closed, and reconnects for the new hello and a snapshot. The load is what
the peer's Prometheus page says (`junction attach --metrics`): its cache usage, in both groups.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

from attach.bridge.feed_keys import FeedKeys
from attach.bridge.stats import BridgeStats
from attach.bridge.table import PeerTable
from engine.cache.lookup import HitGeometry
from engine.events import ATTENTION, MAMBA, CacheEvent, PeerMetrics
from engine.feed import (
    FeedDelta,
    FeedHeartbeat,
    FeedHello,
    FeedLoad,
    FeedSnapshot,
    FeedSubscriber,
    encode,
)

#: The hello's `max_request_tokens`: the peer enforces its own limit (its 400 reaches the
#: client through the router).
PEER_MAX_REQUEST_TOKENS = 2**31 - 1
MAX_SUBSCRIBERS = 8


class Subscription(NamedTuple):
    epoch: int  # the epoch its hello says; another one now means the geometry changed
    frames: list[bytes]  # the hello and the snapshot, to send first


class PeerFeed:
    def __init__(
        self,
        engine_id: str,
        model: str,
        serve_url: str,
        table: PeerTable,
        rank: int = 0,
        max_subscribers: int = MAX_SUBSCRIBERS,
        stats: BridgeStats | None = None,
    ) -> None:
        """`table` is the bridge's, which holds every block's tokens for `FeedKeys.rebuild`;
        `rank` is the one rank announced."""
        self.engine_id, self.model, self.serve_url = engine_id, model, serve_url
        self.table = table
        self.keys = FeedKeys(rank)
        self.max_subscribers = max_subscribers
        self.stats = stats or BridgeStats()
        self.epoch = time.time_ns()
        self.seq = 0
        self.geometry = self.keys.geometry()
        self.load = FeedLoad(0, 0, 0, 0.0, 0.0)
        self.subscribers: list[FeedSubscriber] = []
        self.lock = threading.Lock()  # the keys, seq and subscribers, against the servers

    # ------------------------------------------------------------------ the bridge's thread
    def on_events(self, events: Iterable[CacheEvent]) -> None:
        """Apply a batch the bridge translated (its table already holds it): a delta to every
        subscriber, or a new epoch when the geometry changed."""
        events = list(events)
        if not events:
            return
        with self.lock:
            num_unkeyed = self.keys.num_unkeyed
            self._take_load(events)
            if self.keys.learn(events):  # the unit changed: every key with it
                self.keys.rebuild(self.table.events([self.keys.rank]))
                changes = []
            else:
                changes = self.keys.apply(events)
            geometry = self.keys.geometry()
            if geometry != self.geometry:
                self._new_epoch(geometry)
            elif changes:
                self.seq += 1
                self._push(encode(FeedDelta(self.seq, changes, [], self.load)))
            self.stats.feed_unkeyed.inc(self.keys.num_unkeyed - num_unkeyed)
            states = 1 if self.keys.has_states else 0  # else group 1 mirrors group 0
            for name, group in ((ATTENTION, 0), (MAMBA, states)):
                self.stats.feed_keys.labels(name).set(len(self.keys.held[group]))

    def _take_load(self, events: list[CacheEvent]) -> None:
        for event in events:
            if type(event) is PeerMetrics and event.rank == self.keys.rank:
                if event.usage is not None:
                    self.load = FeedLoad(0, 0, 0, event.usage, event.usage)

    def _new_epoch(self, geometry: HitGeometry) -> None:
        self.epoch = max(time.time_ns(), self.epoch + 1)
        self.geometry = geometry
        for subscriber in self.subscribers:
            subscriber.is_closed = True
            subscriber.wake()
        self.subscribers = []
        self.stats.feed_subscribers.set(0)

    def _push(self, frame: bytes) -> None:
        self.subscribers = [s for s in self.subscribers if not s.is_closed]
        for subscriber in self.subscribers:
            subscriber.push(frame)

    # ------------------------------------------------------------------ the servers' threads
    def subscribe(self, subscriber: FeedSubscriber) -> Subscription | None:
        """The hello and the snapshot for a new subscriber, who then gets every delta after
        them; None when `max_subscribers` follow already."""
        with self.lock:
            self.subscribers = [s for s in self.subscribers if not s.is_closed]
            if len(self.subscribers) >= self.max_subscribers:
                return None
            hello = FeedHello(
                self.engine_id,
                self.epoch,
                self.geometry,
                self.model,
                PEER_MAX_REQUEST_TOKENS,
                serve_url=self.serve_url,
                reports_finished=False,
            )
            snapshot = FeedSnapshot(self.seq, self.keys.keys(0), self.keys.keys(1), self.load)
            self.subscribers.append(subscriber)
            self.stats.feed_subscribers.set(len(self.subscribers))
            return Subscription(self.epoch, [encode(hello), encode(snapshot)])

    def unsubscribe(self, subscriber: FeedSubscriber) -> None:
        subscriber.is_closed = True
        with self.lock:
            self.subscribers = [s for s in self.subscribers if s is not subscriber]
            self.stats.feed_subscribers.set(len(self.subscribers))

    def heartbeat(self) -> bytes:
        with self.lock:
            return encode(FeedHeartbeat(self.seq, self.load))
