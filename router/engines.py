"""`FleetEngine`: one engine as the router sees it, and the feed client that keeps it current.

`follow()` runs for the router's life: it opens the engine's cache feed (`WS /v1/cache/feed`),
applies the snapshot and deltas to the engine's `EngineIndex`, and keeps the engine's load.
The engine is `up` from its first snapshot until the feed closes, breaks its seq, or stays
silent for `silence_s` (the engine sends a heartbeat every 0.5 s); then it is `down`, left out
of routing, and the client reconnects with backoff, starting again from a snapshot.

A bridged vLLM or SGLang engine (`junction attach --feed-port`) is followed the same way: its
feed is the bridge's, its hello names the peer's own server (`serve_url`, where requests go:
`openai_url`) and says that its deltas name no finished requests (`reports_finished`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import msgspec
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.frames import CloseCode

from engine.feed import (
    FeedDelta,
    FeedFinished,
    FeedHeartbeat,
    FeedHello,
    FeedLoad,
    FeedRates,
    FeedSnapshot,
    decode,
)
from engine.hashing import BlockHash, num_known_units
from router.caches.expected import EXPECT_S, PEER_EXPECT_S, Expectations
from router.caches.index import DEFAULT_MAX_KEYS, EngineIndex, FeedGapError
from router.caches.tiers import DEFAULT_RATES, SharedIndex

log = logging.getLogger(__name__)

DEFAULT_SILENCE_S = 1.5  # no frame for this long: the engine is down (taken out within 2 s)
MAX_RECENT_FINISHED = 4096
RETRY_UNREACHABLE_S = 2.0  # a bridged peer whose server refused a connection, tried again
CLOSE_TIMEOUT_S = 0.5  # the close handshake with an engine that went silent: it may be frozen
#: the longest an engine may send nothing while answering (a non-streamed answer comes whole
#: at its end, so this bounds a whole generation's time too): then the client is answered 502
#: (the request was sent and may have run: it is never sent again). `--read-timeout`.
DEFAULT_READ_TIMEOUT_S = 300.0
#: How long an answer's end waits for the engine's feed to report the request finished, so
#: that the index holds what it stored before the client's next turn (`--finish-wait-s`; 0:
#: not at all, and the router's expectations alone keep the prefix on its engine meanwhile).
FINISH_WAIT_S = 0.5


@dataclass
class InFlight:
    """A request this router sent an engine and has not seen finish there."""

    hashes: list[BlockHash]
    num_prompt_tokens: int
    predicted: int

    @property
    def num_prefill(self) -> int:
        """The prompt tokens it computes there: beyond the hit predicted."""
        return self.num_prompt_tokens - self.predicted


@dataclass
class FleetEngine:
    url: str  # the engine's identity and feed (`http://host:port`); requests: `openai_url`
    hello: FeedHello | None = None
    index: EngineIndex | None = None
    status: str = "connecting"  # "connecting", "up" or "down"
    down_reason: str | None = None
    last_frame_ts: float = 0.0  # monotonic
    load: FeedLoad = FeedLoad(0, 0, 0, 0.0, 0.0)
    in_flight: dict[str, InFlight] = field(default_factory=dict)  # by engine request id
    in_flight_keys: Counter[BlockHash] = field(default_factory=Counter)
    in_flight_prefill: int = 0  # their prompt tokens less their predicted hits
    # requests that finished there and that its feed has not confirmed: cache, not load
    expected: Expectations = field(default_factory=Expectations)
    recent_finished: OrderedDict[str, FeedFinished] = field(default_factory=OrderedDict)
    waiters: dict[str, asyncio.Future[FeedFinished]] = field(default_factory=dict)
    num_routed: int = 0
    num_prompt_tokens: int = 0
    num_predicted_tokens: int = 0
    num_realised_tokens: int = 0
    num_failed: int = 0
    num_snapshots: int = 0
    max_index_keys: int = DEFAULT_MAX_KEYS
    retry_at: float | None = None  # monotonic: when an unreachable peer is tried again
    shared: SharedIndex | None = None  # the fleet's: the shared store's units it announces

    @property
    def rates(self) -> FeedRates:
        """What its feed says it measured; `DEFAULT_RATES` where it says nothing."""
        return self.load.rates or DEFAULT_RATES

    @property
    def shared_store(self) -> str | None:
        """ "up" or "down" as its feed says it reaches its shared store; None: it has none (or
        its feed does not say)."""
        rates = self.load.rates
        if rates is None or rates.shared_up is None:
            return None
        return "up" if rates.shared_up else "down"

    # ------------------------------------------------------------------ reads
    @property
    def is_up(self) -> bool:
        return self.status == "up" and self.index is not None and self.index.is_ready

    @property
    def engine_id(self) -> str | None:
        return self.hello.engine_id if self.hello else None

    @property
    def model(self) -> str | None:
        return self.hello.model if self.hello else None

    @property
    def openai_url(self) -> str:
        """Where its requests go: the hello's `serve_url` when the feed is served by someone
        else than the engine (`junction attach --feed-port`), else `url` itself."""
        serve_url = self.hello.serve_url if self.hello else None
        return serve_url.rstrip("/") if serve_url else self.url

    @property
    def speaks_junction(self) -> bool:
        """Whether the server its requests go to is a Junction engine (takes the bodies'
        `junction` extensions); a bridged peer's is vLLM's or SGLang's own."""
        return not (self.hello and self.hello.serve_url)

    @property
    def reports_finished(self) -> bool:
        """Whether its feed names the requests that finished (a bridged peer's does not)."""
        return self.hello.reports_finished if self.hello else True

    @property
    def num_running(self) -> int:
        """Requests running or waiting there: what its feed said, less those this router saw
        finish that the feed has not confirmed (its load predates their end), or those this
        router sent it and has not seen finish, whichever is more."""
        said = self.load.num_running + self.load.num_waiting - len(self.expected)
        return max(said, len(self.in_flight))

    def load_tokens(self, running_cost: int) -> int:
        """Its queue in prefill tokens: what its feed said, less the prefill of requests this
        router saw finish that the feed has not confirmed (its load may predate their end), or
        what this router sent it and has not seen finish, whichever is more (the feed lags a
        step); running requests weighted."""
        said = self.load.num_prefill_tokens - self.expected.num_prefill
        return max(said, self.in_flight_prefill) + running_cost * self.num_running

    def in_flight_shared(self, hashes: list[BlockHash]) -> int:
        """How many leading units of `hashes` a request in flight here shares (chained hashes:
        a shared unit means every earlier one is shared too, so a binary search finds it)."""
        return num_known_units(hashes, self.in_flight_keys) if self.in_flight_keys else 0

    # ------------------------------------------------------------------ in flight
    def start(self, request_id: str, entry: InFlight) -> None:
        self.in_flight[request_id] = entry
        self.in_flight_prefill += entry.num_prefill
        self.in_flight_keys.update(entry.hashes)

    def end(self, request_id: str) -> InFlight | None:
        entry = self.in_flight.pop(request_id, None)
        if entry is None:
            return None
        self.in_flight_prefill -= entry.num_prefill
        keys = self.in_flight_keys
        for key in entry.hashes:  # one count per request holding the unit; none left: gone
            left = keys[key] - 1
            if left:
                keys[key] = left
            else:
                del keys[key]
        return entry

    def expect(self, request_id: str, entry: InFlight) -> None:
        """`request_id` finished here: its prefix is expected in the cache until the feed
        confirms it (at once when it already did) or contradicts it."""
        if request_id not in self.recent_finished:
            ttl_s = EXPECT_S if self.reports_finished else PEER_EXPECT_S
            self.expected.add(
                request_id, entry.hashes, entry.num_prompt_tokens, ttl_s, entry.num_prefill
            )

    async def wait_finished(self, request_id: str, timeout_s: float) -> FeedFinished | None:
        """The feed's word that `request_id` finished (its keys are then in the index), or
        None after `timeout_s`, or at once from a feed that names no finished requests."""
        if not self.reports_finished:
            return None
        if request_id in self.recent_finished:
            return self.recent_finished[request_id]
        future = self.waiters.setdefault(request_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            return None
        finally:
            self.waiters.pop(request_id, None)

    def mark_down(self, reason: str) -> None:
        if self.status != "down":
            log.warning("engine %s is down: %s", self.url, reason)
        self.status, self.down_reason = "down", reason
        self.retry_at = None
        for request_id in list(self.in_flight):
            self.end(request_id)
        self.expected.clear()

    def mark_unreachable(self, reason: str) -> None:
        """Its OpenAI server refused a connection or closed it without an answer. A dead
        engine's feed goes down with it (and its next snapshot brings it back); an engine
        whose feed still speaks (a bridged peer, or one whose HTTP side alone fails) is tried
        again `RETRY_UNREACHABLE_S` later: one request each time, which fails over again."""
        self.mark_down(reason)
        if self.hello is not None:
            self.retry_at = time.monotonic() + RETRY_UNREACHABLE_S

    # ------------------------------------------------------------------ the feed
    def apply(self, data: bytes) -> None:
        frame = decode(data)
        self.last_frame_ts = time.monotonic()
        if isinstance(frame, FeedHello):
            self.hello = frame
            self.index = EngineIndex(frame.geometry, self.max_index_keys)
            self.expected.clear()
        elif isinstance(frame, FeedSnapshot):
            if self.index is None:
                raise FeedGapError("a snapshot before the hello")
            self.index.apply_snapshot(frame, self.shared)
            self.expected.clear()  # what it holds now, whatever this router expected
            self.load = frame.load
            self.num_snapshots += 1
            self.status, self.down_reason, self.retry_at = "up", None, None
        elif isinstance(frame, FeedDelta):
            if self.index is None:
                raise FeedGapError("a delta before the hello")
            self.index.apply_delta(frame, self.shared)
            self.load = frame.load
            self._check_expected(frame)
            for finished in frame.finished:
                self._finished(finished)
        elif isinstance(frame, FeedHeartbeat):
            self.load = frame.load
        if self.retry_at is not None and self.last_frame_ts >= self.retry_at:
            if self.index is not None and self.index.is_ready:
                self.status, self.down_reason, self.retry_at = "up", None, None

    def _check_expected(self, delta: FeedDelta) -> None:
        """What `delta` removed contradicts the expectations holding it; a feed that names no
        finished requests confirms those whose prefix its index now holds."""
        expected = self.expected
        if not expected:
            return
        for change in delta.changes:
            if change.op == "clear":
                expected.clear()
                return
            if change.op == "remove":
                expected.contradict(change.keys)
        if not self.reports_finished and self.index is not None:
            expected.confirm_held(self.index)

    def _finished(self, finished: FeedFinished) -> None:
        self.end(finished.request_id)
        self.expected.drop(finished.request_id)
        self.recent_finished[finished.request_id] = finished
        while len(self.recent_finished) > MAX_RECENT_FINISHED:
            self.recent_finished.popitem(last=False)
        waiter = self.waiters.get(finished.request_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(finished)


async def follow(
    engine: FleetEngine,
    token: str,
    silence_s: float = DEFAULT_SILENCE_S,
) -> None:
    """Keep `engine`'s index current for as long as the task runs."""
    url = "ws" + engine.url.removeprefix("http") + "/v1/cache/feed"
    delay = 0.1
    while True:
        try:
            async with connect(
                url,
                additional_headers={"Authorization": f"Bearer {token}"},
                open_timeout=silence_s,
                max_size=feed_frame_bytes(engine.max_index_keys),
                ping_interval=None,  # its heartbeats, every 0.5 s, are the liveness check
                close_timeout=CLOSE_TIMEOUT_S,
            ) as socket:
                engine.index = None
                if engine.status != "down":  # a down engine stays down until its snapshot
                    engine.status = "connecting"
                while True:
                    try:
                        data = await asyncio.wait_for(socket.recv(), silence_s)
                    except TimeoutError:
                        # down now, not after the close handshake a frozen engine never
                        # answers (`close_timeout`: it took 10 s more, issue 47, item 7)
                        engine.mark_down(f"no word on its cache feed for {silence_s:g} s")
                        raise
                    if isinstance(data, str):
                        raise FeedGapError("a text frame on the cache feed")
                    engine.apply(data)
                    delay = 0.1
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            engine.mark_down(f"no word on its cache feed for {silence_s:g} s")
        except ConnectionClosed as exc:
            engine.mark_down(_closed_reason(exc, engine.max_index_keys))
        except InvalidStatus as exc:
            engine.mark_down(f"its cache feed answered HTTP {exc.response.status_code}")
        except (FeedGapError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            engine.mark_down(f"its cache feed broke: {exc}")
        except (OSError, InvalidURI) as exc:
            engine.mark_down(f"cannot reach its cache feed: {exc}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def feed_frame_bytes(max_index_keys: int) -> int:
    """The largest feed frame a router reads from an engine: a snapshot of `max_index_keys`
    keys (16 bytes and a 2-byte header each) and 1 MiB for the rest. A larger frame closes the
    connection (1009) and leaves the engine out."""
    return max_index_keys * 18 + (1 << 20)


def _closed_reason(exc: ConnectionClosed, max_index_keys: int = DEFAULT_MAX_KEYS) -> str:
    sent = exc.sent
    if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
        return (
            f"its cache feed sent a frame over {feed_frame_bytes(max_index_keys):,} bytes, "
            f"more than {max_index_keys:,} keys take (--max-index-keys)"
        )
    close = exc.rcvd
    if close is None:
        return "its cache feed closed without a word"
    return f"its cache feed closed ({close.code}: {close.reason or 'no reason'})"
