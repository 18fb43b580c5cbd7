"""`Expectations`: what an engine should hold from requests this router sent it that finished
there, until its feed says so.

The answer's end reaches the router before the engine's feed has told it what the request
stored: on a busy machine the feed lags, and a family's next request, arriving in between,
would be scored on an index that does not yet hold its prefix and sent elsewhere (issue 50).
So a request that finishes unconfirmed leaves its prompt's chained hashes here, scored as that
engine's cache (the hit the in-flight score counts: the prefix in both groups), never as its
load, until the feed confirms them (its `FeedFinished` for the request, which follows the
request's block events; for a feed that names no finished requests, the index's hit on the
prefix reaching the expected one) or contradicts them (a delta removes one of their units, the
request failed, the engine went down or sent a new hello or snapshot).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.cache.lookup import reachable_hit
from engine.hashing import BlockHash, num_known_units
from router.caches.index import EngineIndex

#: Expectations kept per engine, the oldest dropped first: a feed confirms within its lag, and
#: even at 100 requests/s an engine finishes far fewer than this in a second of lag.
MAX_EXPECTED = 256
#: ... and their units in all, so that long prompts stay bounded in memory too (16 bytes and a
#: count each: about 10 MB at most per engine; 256 prompts of 16k units fill it)
MAX_EXPECTED_UNITS = 100_000
#: How long an expectation stands without word from the feed: a loaded machine's feed lags a
#: second or so; one whose confirmation never comes (an engine request id the feed does not
#: name) must stop steering requests soon after, since nothing else would remove it.
EXPECT_S = 10.0
#: The same for a feed that names no finished requests (a bridged peer): its bridge relays the
#: blocks within a step or two, and the index's own hit confirms them; no longer than this.
PEER_EXPECT_S = 2.0


@dataclass(frozen=True)
class Expected:
    hashes: list[BlockHash]  # the prompt's chained hashes at the engine's match unit
    num_tokens: int  # the prompt's length
    until: float  # monotonic: dropped then, confirmed or not
    num_prefill: int = 0  # the prompt tokens it was to compute (beyond the hit predicted)


class Expectations:
    """One engine's expectations by engine request id, oldest first, with their units counted
    (one count per expectation holding the unit)."""

    def __init__(
        self,
        max_entries: int = MAX_EXPECTED,
        clock: Callable[[], float] = time.monotonic,
        max_units: int = MAX_EXPECTED_UNITS,
    ) -> None:
        self.max_entries = max_entries
        self.max_units = max_units
        self.clock = clock
        self.entries: OrderedDict[str, Expected] = OrderedDict()
        self.keys: Counter[BlockHash] = Counter()
        self.num_units = 0  # the entries' hashes, counted with repeats
        self._num_prefill = 0  # the entries' `num_prefill`, summed

    def __len__(self) -> int:
        """How many stand now (those past their time are dropped first)."""
        self.expire()
        return len(self.entries)

    @property
    def num_prefill(self) -> int:
        """The prompt tokens the requests standing now were to compute: a feed's load from
        before they finished may still count them as queued."""
        self.expire()
        return self._num_prefill

    def add(
        self,
        request_id: str,
        hashes: list[BlockHash],
        num_tokens: int,
        ttl_s: float,
        num_prefill: int = 0,
    ) -> None:
        self.drop(request_id)
        entry = Expected(hashes, num_tokens, self.clock() + ttl_s, num_prefill)
        self.entries[request_id] = entry
        self.keys.update(hashes)
        self.num_units += len(hashes)
        self._num_prefill += num_prefill
        while len(self.entries) > self.max_entries or self.num_units > self.max_units:
            self.drop(next(iter(self.entries)))  # the newest alone over it: it goes too

    def drop(self, request_id: str) -> None:
        entry = self.entries.pop(request_id, None)
        if entry is None:
            return
        self.num_units -= len(entry.hashes)
        self._num_prefill -= entry.num_prefill
        keys = self.keys
        for key in entry.hashes:
            left = keys[key] - 1
            if left:
                keys[key] = left
            else:
                del keys[key]

    def clear(self) -> None:
        self.entries.clear()
        self.keys.clear()
        self.num_units = 0
        self._num_prefill = 0

    def expire(self) -> None:
        """Drop those past their time (each engine's entries share one TTL: the oldest first)."""
        now = self.clock()
        while self.entries:
            request_id, entry = next(iter(self.entries.items()))
            if entry.until > now:
                return
            self.drop(request_id)

    def shared(self, hashes: list[BlockHash]) -> int:
        """How many leading units of `hashes` an expectation holds (chained hashes: a binary
        search, as for the requests in flight)."""
        self.expire()
        return num_known_units(hashes, self.keys) if self.keys else 0

    def contradict(self, removed: Iterable[BlockHash]) -> None:
        """The feed removed these units: every expectation holding one of them goes."""
        gone = {key for key in removed if key in self.keys}
        if not gone:
            return
        for request_id, entry in list(self.entries.items()):
            if not gone.isdisjoint(entry.hashes):
                self.drop(request_id)

    def confirm_held(self, index: EngineIndex) -> None:
        """Drop those whose prefix the index now serves as fully as expected (for a feed that
        names no finished requests)."""
        geometry = index.geometry
        for request_id, entry in list(self.entries.items()):
            expected = reachable_hit(
                geometry, len(entry.hashes) * geometry.match_unit, entry.num_tokens
            )
            found = index.hit(entry.hashes, entry.num_tokens)
            if (found.length if found else 0) >= expected:
                self.drop(request_id)
