"""The engine's diagnosis of its own misses: the control plane's online oracle, kept in memory
for this engine epoch, so a response can say why its prompt missed what it missed.

The oracle follows the engine's events (`DiagnosingSink` hands it every one as it is emitted;
its step listener folds them in on the engine thread). It keeps what the control plane keeps
at ingest (`api.attribution.record`), unsalted and in memory:

- each match unit that a finished sequence held (a request's prompt and output, a materialized
  pin's prefix): the earliest arrival that held it and the earliest finish of one
  (`workloads.attribute.Record`), least recently seen first out past `max_units`;
- each unit a tier below the device took, when, and when it gave it up (`TierRecord`), past
  `max_units` the same way;
- the requests whose caller asked for a diagnosis (`expect`), at most `max_waiting`, until every
  request that arrived before them has finished (`oldest_unfinished_index` passes them): then
  `workloads.attribute.attribute_units` splits their misses, as the control plane's ingest
  does with the same records, and their future gets the diagnosis.

Time stamps agree with the store's: a pin's finish and a tier's store or removal are stamped
when the step that emitted them ends, which is when the publisher stamps their batch, and no
request arrives between the two. What differs from the store's attribution: the store also
knows the units of earlier epochs (this process's memory started empty), so after a restart
the engine's diagnosis has no `restarted` tokens and a shorter `diverged_at` where the store
has them; and past either side's bounds (the store's window and unit cap, this oracle's
`max_units`) the two forget different units.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING

from engine.events import (
    ATTENTION,
    BELOW_DEVICE,
    UNIT_HASH_BYTES,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    PinUpdated,
    RequestFinished,
)
from engine.feed import FeedHub, FeedSink
from workloads.attribute import Record, Subject, TierRecord, attribute_units
from workloads.misses import HitGrid, remedies
from workloads.oracle import capped_hit

if TYPE_CHECKING:
    from engine.engine import Engine

# unit records kept, and as many tier records: about 31 MB and 45 MB when full (measured with
# tracemalloc); 100,000 units are 1.6M distinct prefix tokens at U = 16
MAX_UNITS = 100_000
MAX_WAITING = 1024  # requests waiting for their diagnosis; past it the oldest gets none
HEX = 2 * UNIT_HASH_BYTES


def chain(unit_hashes: str) -> list[int]:
    """A sequence's unit hashes (`RequestFinished.unit_hashes`) as integers."""
    return [int(unit_hashes[i : i + HEX], 16) for i in range(0, len(unit_hashes), HEX)]


class DiagnosisOracle:
    def __init__(self, max_units: int = MAX_UNITS, max_waiting: int = MAX_WAITING) -> None:
        self.max_units = max_units
        self.max_waiting = max_waiting
        self.grid: HitGrid | None = None
        self.epoch = 0
        self.units: OrderedDict[int, Record] = OrderedDict()
        self.tiers: OrderedDict[int, dict[str, TierRecord]] = OrderedDict()
        self.saw_tiers = False  # a tier unit was named: the evicted span is split by tier
        self.oldest_unfinished = 0
        self.events: list[CacheEvent] = []  # emitted since the last step listener call
        self.lock = threading.Lock()  # `expect` (any thread) against the engine thread
        self.wanted: OrderedDict[str, Future[dict | None]] = OrderedDict()
        self.waiting: list[tuple[RequestFinished, Future[dict | None]]] = []

    def attach(self, engine: Engine) -> None:
        """Follow `engine` (built with a `DiagnosingSink` of this oracle) before it steps."""
        self.grid = HitGrid.of(engine.cache_geometry())
        self.epoch = engine.epoch
        engine.step_listeners.append(self.on_step)

    # ------------------------------------------------------------------ any thread
    def expect(self, request_id: str) -> Future[dict | None]:
        """The future of `request_id`'s diagnosis; ask before the request is submitted. It
        gets None when the engine keeps no hit grid, or when `max_waiting` later requests
        pushed it out."""
        future: Future[dict | None] = Future()
        if self.grid is None:
            future.set_result(None)
            return future
        with self.lock:
            self.wanted[request_id] = future
            while len(self.wanted) > self.max_waiting:
                _resolve(self.wanted.popitem(last=False)[1], None)
        return future

    def forget(self, request_id: str) -> None:
        """The caller no longer waits (its client hung up)."""
        with self.lock:
            self.wanted.pop(request_id, None)

    # ------------------------------------------------------------------ engine thread
    def tap(self, event: CacheEvent) -> None:
        if self.grid is None:  # not attached, or an engine with no hit grid: nothing to keep
            return
        kind = type(event)
        if kind is RequestFinished or kind is PinUpdated:
            self.events.append(event)
        elif (kind is BlockStored or kind is BlockRemoved) and event.medium in BELOW_DEVICE:
            self.events.append(event)

    def on_step(self, engine: Engine) -> None:
        events, self.events = self.events, []
        if not events or self.grid is None:
            return
        ts = time.time()  # the publisher's stamp of this step's batch, as near as the clock
        for event in events:
            kind = type(event)
            if kind is RequestFinished:
                self._finished(event)
            elif kind is PinUpdated:
                if event.state == "materialized" and event.arrival_index is not None:
                    self._merge(chain(event.unit_hashes), event.arrival_index, ts)
            else:
                self._tier(event, ts)
        self._attribute_due()

    def _finished(self, event: RequestFinished) -> None:
        if event.match_stop is None:  # never looked up (aborted while waiting): the store
            with self.lock:  # attributes it no more than this does
                future = self.wanted.pop(event.request_id, None)
            if future is not None:
                _resolve(future, None)
            return
        self._merge(chain(event.unit_hashes), event.arrival_index, event.finished_ts)
        self.oldest_unfinished = max(self.oldest_unfinished, event.oldest_unfinished_index)
        with self.lock:
            future = self.wanted.pop(event.request_id, None)
        if future is not None:
            self.waiting.append((event, future))
            if len(self.waiting) > self.max_waiting:
                _resolve(self.waiting.pop(0)[1], None)

    def _merge(self, units: list[int], index: int, ts: float) -> None:
        """Fold one sequence's chain in, as `api.attribution.shared_units.merge` does."""
        epoch = self.epoch
        for unit in units:
            seen = self.units.pop(unit, None)
            if seen is None:
                seen = Record(epoch, index, ts, epoch, ts)
            else:
                first = min((seen.first_epoch, seen.first_index), (epoch, index))
                finished = min(seen.first_finished_ts, ts)
                seen = Record(*first, finished, epoch, min(seen.last_epoch_finished_ts, ts))
            self.units[unit] = seen
        while len(self.units) > self.max_units:
            self.units.popitem(last=False)

    def _tier(self, event: BlockStored | BlockRemoved, ts: float) -> None:
        """A tier took or gave up units, as `api.ingest.tiers.apply` keeps them."""
        self.saw_tiers = True
        for key in event.block_hashes:
            unit = int(key[:HEX].ljust(HEX, "0"), 16)
            held = self.tiers.pop(unit, {})
            if type(event) is BlockStored:
                held[event.medium] = TierRecord(event.medium, ts, None)
            elif event.medium in held:
                held[event.medium] = held[event.medium]._replace(removed_ts=ts)
            if held:
                self.tiers[unit] = held
        while len(self.tiers) > self.max_units:
            self.tiers.popitem(last=False)

    def _attribute_due(self) -> None:
        due = [(e, f) for e, f in self.waiting if e.arrival_index < self.oldest_unfinished]
        if not due:
            return
        oldest = self.oldest_unfinished
        self.waiting = [(e, f) for e, f in self.waiting if e.arrival_index >= oldest]
        for event, future in due:
            _resolve(future, self.diagnose(event))

    def diagnose(self, event: RequestFinished) -> dict:
        """`event`'s diagnosis from the records kept now. Reads only."""
        grid = self.grid
        units = chain(event.unit_hashes)[: event.num_prompt_tokens // grid.unit]
        tiers = None
        if grid.has_tiers or self.saw_tiers:
            tiers = {u: list(self.tiers[u].values()) for u in units if u in self.tiers}
        subject = Subject(
            self.epoch,
            event.arrival_index,
            event.arrival_ts,
            event.num_cached_tokens,
            event.hit_tokens_by_group.get(ATTENTION, 0),
            event.match_stop,
            units,
        )
        shared, missed = attribute_units(subject, self.units, grid, tiers)
        return {
            "epoch": self.epoch,
            "arrival_index": event.arrival_index,
            "match_unit": grid.unit,
            "hit_stopped_at": event.num_cached_tokens,
            "diverged_at": shared,
            "oracle_tokens": capped_hit(shared, event.num_prompt_tokens, grid.unit, grid.eagle),
            "stop_reason": event.match_stop.reason,
            "missed_tokens": missed,
            "remedies": remedies(missed),
        }


def _resolve(future: Future[dict | None], diagnosis: dict | None) -> None:
    """Hand the diagnosis over unless its waiter gave up (cancelled on its timeout)."""
    try:
        future.set_result(diagnosis)
    except InvalidStateError:
        pass


class DiagnosingSink(FeedSink):
    """`junction serve`'s sink: the feed's, and every event also to the diagnosis oracle."""

    def __init__(self, hub: FeedHub, keep_events: bool, oracle: DiagnosisOracle) -> None:
        super().__init__(hub, keep_events)
        self.oracle = oracle

    def emit(self, event: CacheEvent) -> None:
        super().emit(event)
        self.oracle.tap(event)
