"""Tier-aware routing (issue 49) on what real feed frames say, over real websockets: the
router's feed client (`router.engines.follow`) reads stand-in engines' feeds, which announce
device keys, the units their host tier and the fleet's shared store hold, and their measured
rates, and `Fleet.route` prices each engine in predicted prefill seconds.

- A host-tier hit beats a shorter device hit elsewhere when its load is cheap, and loses to it
  when the load rate is slow enough that prefilling the difference is sooner.
- A prefix that lives only in the shared store goes to the least-loaded engine, whichever
  engine announced it; its removal, or its TTL running out, stops it being scored.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import msgspec
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from engine.cache.lookup import HitGeometry
from engine.feed import (
    FeedDelta,
    FeedHeartbeat,
    FeedHello,
    FeedLoad,
    FeedRates,
    FeedSnapshot,
    TierChange,
    decode,
    encode,
)
from engine.hashing import hash_prefix
from router.engines import FleetEngine, follow
from router.fleet import Fleet
from router.policies import make_policy

UNIT = 16
GEOMETRY = HitGeometry(UNIT, UNIT, UNIT, 0, True, True)
PROMPT = list(range(1000, 1000 + 1024))  # 64 units
KEYS = hash_prefix(PROMPT, UNIT)
PREFILL = 10_000.0  # tokens per second, every engine's


def key_at(position: int) -> bytes:
    return KEYS[position // UNIT - 1]


def unit(medium: str, start: int, end: int, num_bytes: int, op: str = "store") -> TierChange:
    """The unit of `PROMPT`'s `[start, end)` in `medium`."""
    parent = key_at(start) if start else None
    return TierChange(op, medium, key_at(end), parent, start, end, num_bytes)  # type: ignore[arg-type]


def load(prefill_tokens: int = 0, host_rate: float = 1e9, ttl_s: float | None = None) -> FeedLoad:
    return FeedLoad(0, 0, prefill_tokens, 0.0, 0.0, FeedRates(PREFILL, host_rate, None, 1e9, ttl_s))


class StandIn:
    """A stand-in engine's cache feed: a hello and `snapshot`, then what `send` queues, and a
    heartbeat with the snapshot's load every 0.1 s while nothing is queued."""

    def __init__(self, engine_id: str, snapshot: FeedSnapshot, raw: dict | None = None) -> None:
        self.engine_id = engine_id
        self.snapshot = snapshot
        self.raw = raw  # sent instead of `snapshot`: what no struct would build
        self.seq = snapshot.seq
        self.frames: queue.Queue[bytes] = queue.Queue()
        self.url = ""

    def send_delta(self, tiers: list[TierChange]) -> None:
        self.seq += 1
        self.frames.put(encode(FeedDelta(self.seq, [], [], self.snapshot.load, tiers)))

    def handler(self, socket: ServerConnection) -> None:
        try:
            socket.send(encode(FeedHello(self.engine_id, 0, GEOMETRY, "m", 1 << 16)))
            socket.send(
                encode(self.snapshot) if self.raw is None else msgspec.msgpack.encode(self.raw)
            )
            while True:
                try:
                    socket.send(self.frames.get(timeout=0.1))
                except queue.Empty:
                    socket.send(encode(FeedHeartbeat(self.seq, self.snapshot.load)))
        except ConnectionClosed:
            pass


@contextmanager
def serving(*stand_ins: StandIn) -> Iterator[None]:
    with ExitStack() as stack:
        for stand_in in stand_ins:
            server = stack.enter_context(serve(stand_in.handler, "127.0.0.1", 0))
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            stack.callback(thread.join, 10)
            stack.callback(server.shutdown)
            stand_in.url = f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        yield


async def until(what: str, check, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not {what} within {timeout_s} s")
        await asyncio.sleep(0.02)


def followed(fleet: Fleet, stand_ins: list[StandIn]) -> list[asyncio.Task]:
    tasks = []
    for stand_in in stand_ins:
        engine = fleet.add(FleetEngine(stand_in.url))
        tasks.append(asyncio.create_task(follow(engine, "token")))
    return tasks


def run_with(stand_ins: list[StandIn], body, fleet: Fleet | None = None) -> None:
    fleet = fleet or Fleet([], make_policy("hybrid"), running_cost=0)

    async def main() -> None:
        tasks = followed(fleet, stand_ins)
        try:
            await until("every engine up", lambda: len(fleet.up()) == len(stand_ins))
            await body(fleet)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    with serving(*stand_ins):
        asyncio.run(main())


def route(fleet: Fleet):
    """Score `PROMPT` and leave nothing behind: not in flight, nor expected from its finish
    (these stand-ins' feeds never confirm it: the next route scores only what they said)."""
    decision = fleet.route(PROMPT, "m")
    fleet.finish(decision, None)
    fleet.engines[decision.url].expected.clear()
    return decision, {s.engine_id: s for s in decision.scores}


def host_against_device(host_rate: float) -> tuple:
    """Engine `device` holds 320 tokens on the device; engine `host` holds 160 there and the
    unit of [160, 800) in host memory, 1 MB to load."""
    device = StandIn("device", FeedSnapshot(0, KEYS[:20], KEYS[:20], load()))
    host = StandIn(
        "host",
        FeedSnapshot(
            0, KEYS[:10], KEYS[:10], load(host_rate=host_rate), [unit("host", 160, 800, 10**6)]
        ),
    )
    found = []

    async def body(fleet: Fleet) -> None:
        found.append(route(fleet))

    run_with([device, host], body)
    return found[0]


def test_a_cheap_host_hit_beats_a_shorter_device_hit() -> None:
    decision, scores = host_against_device(host_rate=1e9)  # 1 ms to load 640 tokens
    assert decision.engine_id == "host"
    assert scores["host"].tier_hit == {"device": 160, "host": 640}
    assert scores["host"].load_bytes == {"host": 10**6}
    assert decision.predicted_hit == 800
    # 1024 - 800 tokens at 10k/s, and the load
    assert abs(decision.predicted_s - (224 / PREFILL + 1e6 / 1e9)) < 1e-9
    assert scores["device"].tier_hit == {"device": 320}
    assert scores["host"].predicted_s < scores["device"].predicted_s


def test_a_slow_host_load_loses_to_the_device_hit() -> None:
    """60 ms to load at 1/60 GB/s: the engine would still take it (prefilling its 640 tokens
    takes 64 ms), but computing the 480 tokens the device hit leaves takes 48 ms."""
    decision, scores = host_against_device(host_rate=1e6 / 0.060)
    assert decision.engine_id == "device"
    assert scores["host"].tier_hit == {"device": 160, "host": 640}
    assert scores["device"].predicted_s < scores["host"].predicted_s
    assert decision.predicted_hit == 320


def test_a_load_slower_than_its_prefill_is_not_counted() -> None:
    decision, scores = host_against_device(host_rate=1e6)  # 1 s against 64 ms of prefill
    assert decision.engine_id == "device"
    assert scores["host"].tier_hit == {"device": 160}


def test_a_shared_only_prefix_goes_to_the_least_loaded_engine_until_it_is_gone() -> None:
    """`announcer` put the unit of [0, 800) in the shared store; `idle` has the least load, so
    it loads it there. Once `announcer` says it is gone, no engine scores it."""
    shared = unit("shared", 0, 800, 10**6)
    busy = StandIn("busy", FeedSnapshot(0, [], [], load(prefill_tokens=600)))
    announcer = StandIn("announcer", FeedSnapshot(0, [], [], load(prefill_tokens=300), [shared]))
    idle = StandIn("idle", FeedSnapshot(0, [], [], load(prefill_tokens=100)))

    async def body(fleet: Fleet) -> None:
        decision, scores = route(fleet)
        assert decision.engine_id == "idle" and decision.predicted_hit == 800
        assert {s.tier_hit.get("shared", 0) for s in scores.values()} == {800}
        announcer.send_delta([unit("shared", 0, 800, 0, op="remove")])
        await until("the removal applied", lambda: len(fleet.shared) == 0)
        decision, scores = route(fleet)
        assert decision.predicted_hit == 0 and decision.reason == "least_loaded"
        assert all(s.tier_hit == {"device": 0} for s in scores.values())

    run_with([busy, announcer, idle], body)


def test_a_shared_entry_is_not_scored_past_the_ttl_its_engine_states() -> None:
    now = [1000.0]
    fleet = Fleet([], make_policy("hybrid"), running_cost=0)
    fleet.shared.clock = lambda: now[0]
    snapshot = FeedSnapshot(0, [], [], load(ttl_s=30.0), [unit("shared", 0, 800, 10**6)])
    announcer = StandIn("announcer", snapshot)

    async def body(fleet: Fleet) -> None:
        now[0] += 29.0
        assert route(fleet)[0].predicted_hit == 800
        now[0] += 2.0
        assert route(fleet)[0].predicted_hit == 0
        assert len(fleet.shared) == 0

    run_with([announcer], body, fleet)


def test_the_device_only_policy_does_not_see_the_host_hit() -> None:
    """The same fleet as the cheap host hit, scored by `hybrid_device`: the device hit wins,
    and its record still shows what the host tier would add."""
    device = StandIn("device", FeedSnapshot(0, KEYS[:20], KEYS[:20], load()))
    host = StandIn(
        "host", FeedSnapshot(0, KEYS[:10], KEYS[:10], load(), [unit("host", 160, 800, 10**6)])
    )

    async def body(fleet: Fleet) -> None:
        decision, scores = route(fleet)
        assert decision.engine_id == "device" and decision.predicted_hit == 320
        assert scores["host"].tier_hit == {"device": 160, "host": 640}

    run_with([device, host], body, Fleet([], make_policy("hybrid_device"), running_cost=0))


def test_bad_rates_take_their_engine_out_and_the_others_serve() -> None:
    """Snapshots whose rates are NaN, 0, negative or past 10^18 (and a unit that ends where
    it starts): each such engine is down, its reason naming the field, and requests go to the
    healthy one."""
    bad_rates = {
        "nan-prefill": FeedRates(float("nan")),
        "zero-prefill": FeedRates(0.0),
        "negative-host": FeedRates(PREFILL, -1.0),
        "huge-shared": FeedRates(PREFILL, None, None, 1e19),
        "zero-ttl": FeedRates(PREFILL, None, None, 1e9, 0.0),
    }
    stand_ins = [
        StandIn(name, FeedSnapshot(0, [], [], FeedLoad(0, 0, 0, 0.0, 0.0, rates)))
        for name, rates in bad_rates.items()
    ]
    snapshot = FeedSnapshot(0, [], [], load())
    raw = {**msgspec.to_builtins(snapshot), "type": "snapshot"}
    raw["tiers"] = [["store", "host", KEYS[3], KEYS[1], 64, 32, 10]]  # [64, 32)
    stand_ins.append(StandIn("bad-unit", snapshot, raw))
    healthy = StandIn("healthy", FeedSnapshot(0, KEYS[:4], KEYS[:4], load()))
    fleet = Fleet([], make_policy("hybrid"), running_cost=0)

    async def main() -> None:
        tasks = followed(fleet, [healthy, *stand_ins])
        engines = {e.url: e for e in fleet.engines.values()}
        try:
            await until(
                "every bad engine down with a reason",
                lambda: all(engines[s.url].down_reason for s in stand_ins),
            )
            await until("the healthy engine up", lambda: len(fleet.up()) == 1)
            for stand_in in stand_ins:
                reason = engines[stand_in.url].down_reason
                field = "tiers" if stand_in.engine_id == "bad-unit" else "load"
                assert not engines[stand_in.url].is_up and field in reason, reason
            for _ in range(5):
                decision, _ = route(fleet)
                assert decision.engine_id == "healthy"
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    with serving(healthy, *stand_ins):
        asyncio.run(main())


def test_a_malformed_tier_unit_or_rate_is_refused_at_decoding() -> None:
    """What takes an engine out (`follow` marks it down on a `ValidationError`): a unit that
    ends where it starts, a first unit with a parent, a TTL of 0."""
    bad = [
        {
            "type": "delta",
            "seq": 1,
            "changes": [],
            "finished": [],
            "load": [0, 0, 0, 0.0, 0.0],
            "tiers": [["store", "host", b"k" * 16, b"p" * 16, 32, 32, 10]],
        },
        {
            "type": "delta",
            "seq": 1,
            "changes": [],
            "finished": [],
            "load": [0, 0, 0, 0.0, 0.0],
            "tiers": [["store", "shared", b"k" * 16, b"p" * 16, 0, 32, 10]],
        },
        {
            "type": "delta",
            "seq": 1,
            "changes": [],
            "finished": [],
            "load": [0, 0, 0, 0.0, 0.0],
            "tiers": [["store", "tape", b"k" * 16, None, 0, 32, 10]],
        },
        {"type": "heartbeat", "seq": 0, "load": [0, 0, 0, 0.0, 0.0, [1e4, None, None, 1e9, 0.0]]},
    ]
    for frame in bad:
        with pytest.raises(msgspec.ValidationError):
            decode(msgspec.msgpack.encode(frame))
    engine = FleetEngine("http://bad")
    engine.apply(encode(FeedHello("bad", 0, GEOMETRY, "m", 1 << 16)))
    with pytest.raises(msgspec.ValidationError):
        engine.apply(msgspec.msgpack.encode(bad[0]))


# a feed reader's frames before the tiers (the trailing rates and the tiers it ignores)
class OldLoad(msgspec.Struct, array_like=True):
    num_running: int
    num_waiting: int
    num_prefill_tokens: int
    attention_usage: float
    mamba_usage: float


class OldSnapshot(msgspec.Struct, tag="snapshot"):
    seq: int
    attention: list[bytes]
    mamba: list[bytes]
    load: OldLoad


def test_a_feed_before_the_tiers_decodes_and_a_reader_before_them_ignores_them() -> None:
    """A snapshot and a load without the new fields decode with none; a reader that knows
    only the old fields decodes a new frame."""
    old = {"type": "snapshot", "seq": 0, "attention": [], "mamba": [], "load": [0, 0, 0, 0.0, 0.0]}
    snapshot = decode(msgspec.msgpack.encode(old))
    assert snapshot.tiers == [] and snapshot.load.rates is None

    new = FeedSnapshot(3, KEYS[:2], KEYS[:1], load(), [unit("host", 0, 32, 5)])
    seen = msgspec.msgpack.decode(encode(new), type=OldSnapshot)
    assert (seen.seq, seen.attention, seen.load.num_prefill_tokens) == (3, KEYS[:2], 0)
