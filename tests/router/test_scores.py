"""What the fleet scores each engine, in the parts a decision records (`GET /fleet/decisions`):
a tie on score, the credit a request in flight earns, and the index's key limit."""

from __future__ import annotations

import pytest

from engine.cache.lookup import HitGeometry
from engine.feed import FeedDelta, FeedHello, FeedLoad, FeedSnapshot, KeyChange, encode
from engine.hashing import hash_prefix
from router.caches.index import FeedGapError
from router.engines import FleetEngine, InFlight
from router.fleet import Fleet
from router.policies import make_policy

UNIT = 16
GEOMETRY = HitGeometry(UNIT, UNIT, UNIT, 0, True, True)
SYSTEM = list(range(800))  # 50 units a family shares


def load(num_prefill_tokens: int) -> FeedLoad:
    return FeedLoad(0, 0, num_prefill_tokens, 0.0, 0.0)


def engine(url: str, cached: list[int], prefill: int = 0, max_keys: int = 1 << 20) -> FleetEngine:
    """An engine whose feed said it holds `cached`'s units in both groups."""
    fleet_engine = FleetEngine(url, max_index_keys=max_keys)
    fleet_engine.apply(encode(FeedHello(url, 0, GEOMETRY, "m", 1 << 20)))
    keys = hash_prefix(cached, UNIT)
    fleet_engine.apply(encode(FeedSnapshot(0, keys, keys, load(prefill))))
    assert fleet_engine.is_up
    return fleet_engine


def parts(decision) -> dict[str, tuple[int, int, int, int]]:
    """Each engine's (hit, in_flight, load, score)."""
    return {s.url: (s.hit, s.in_flight, s.load, s.score) for s in decision.scores}


def test_a_tie_on_score_goes_to_the_lower_load() -> None:
    """608 cached less 100 queued equals 704 less 196: the engine with less queued wins,
    though it was listed second and was routed more."""
    prompt = [*SYSTEM, *range(5000, 5200)]
    busy = engine("http://busy", prompt[:704], prefill=196)
    light = engine("http://light", prompt[:608], prefill=100)
    light.num_routed = 5
    fleet = Fleet([busy, light], make_policy("hybrid"), running_cost=0)
    decision = fleet.route(prompt, "m")
    assert parts(decision) == {
        "http://busy": (704, 0, 196, 508),
        "http://light": (608, 0, 100, 508),
    }
    assert decision.url == "http://light" and decision.reason == "hit"
    assert decision.predicted_hit == 608


def test_in_flight_credit_never_outscores_a_longer_cached_hit() -> None:
    """A producer of the family is in flight on one engine (it holds 400 of the family; the
    request will reuse 800 once the producer is done), another engine holds 816 of the request
    already. The producer's prefill is forgiven up to its queue, never past it: 800 scores
    800, and the longer cached hit wins."""
    producer = [*SYSTEM, *range(9000, 9016)]
    request = [*SYSTEM, *range(7000, 7032)]
    prefilling = engine("http://prefilling", SYSTEM[:400])
    cached = engine("http://cached", request[:816])
    prefilling.start("producer", InFlight(hash_prefix(producer, UNIT), len(producer), 400))
    fleet = Fleet([prefilling, cached], make_policy("hybrid"), running_cost=0)
    decision = fleet.route(request, "m")
    # the producer's queue: 816 - 400 = 416 tokens, all of them credited back
    assert parts(decision) == {
        "http://prefilling": (400, 800, 416, 800),
        "http://cached": (816, 0, 0, 816),
    }
    assert decision.url == "http://cached" and decision.reason == "hit"
    assert decision.predicted_hit == 816


def test_the_in_flight_producer_wins_over_a_shorter_cached_hit() -> None:
    """The same family with the other engine holding less (784): the producer's engine wins
    on its in-flight hit, its queue forgiven."""
    producer = [*SYSTEM, *range(9000, 9016)]
    request = [*SYSTEM, *range(7000, 7032)]
    prefilling = engine("http://prefilling", SYSTEM[:400])
    cached = engine("http://cached", request[:784])
    prefilling.start("producer", InFlight(hash_prefix(producer, UNIT), len(producer), 400))
    fleet = Fleet([prefilling, cached], make_policy("hybrid"), running_cost=0)
    decision = fleet.route(request, "m")
    assert parts(decision)["http://prefilling"] == (400, 800, 416, 800)
    assert decision.url == "http://prefilling" and decision.reason == "in_flight"
    assert decision.predicted_hit == 800


# ---------------------------------------------------------------------- --max-index-keys
def test_a_snapshot_over_the_key_limit_leaves_the_engine_out() -> None:
    """50 units in both groups are 100 keys: a limit of 100 takes them, 99 does not, and the
    engine is left out of routing (not up) with a reason naming --max-index-keys until a
    snapshot within the limit."""
    assert engine("http://at-limit", SYSTEM, max_keys=100).index.num_keys == (50, 50)
    over = FleetEngine("http://over", max_index_keys=99)
    over.apply(encode(FeedHello("over", 0, GEOMETRY, "m", 1 << 20)))
    keys = hash_prefix(SYSTEM, UNIT)
    with pytest.raises(FeedGapError, match="--max-index-keys"):
        over.apply(encode(FeedSnapshot(0, keys, keys, load(0))))
    assert not over.is_up
    fleet = Fleet([over, engine("http://other", [])], make_policy("hybrid"))
    assert fleet.route(SYSTEM, "m").url == "http://other"
    over.apply(encode(FeedSnapshot(0, keys, keys[:49], load(0))))
    assert over.is_up and over.index.num_keys == (50, 49)


def test_a_delta_over_the_key_limit_leaves_the_engine_out() -> None:
    """At the limit of 100 keys, a delta that swaps a key for another is taken (the limit
    holds after each delta, not inside one); a delta that adds a key is not, and the engine is
    left out of routing."""
    keys = hash_prefix(SYSTEM, UNIT)
    fleet_engine = FleetEngine("http://e", max_index_keys=100)
    fleet_engine.apply(encode(FeedHello("e", 0, GEOMETRY, "m", 1 << 20)))
    fleet_engine.apply(encode(FeedSnapshot(0, keys, keys[:49], load(0))))
    extra = hash_prefix(list(range(3000, 3032)), UNIT)
    swap = [KeyChange("remove", 0, keys[49:]), KeyChange("store", 0, extra[:1])]
    fleet_engine.apply(encode(FeedDelta(1, swap, [], load(0))))  # stays at 99
    fleet_engine.apply(encode(FeedDelta(2, [KeyChange("store", 1, keys[49:])], [], load(0))))
    assert fleet_engine.is_up and fleet_engine.index.num_keys == (50, 50)
    swap = [KeyChange("store", 0, extra[1:]), KeyChange("remove", 0, extra[:1])]
    fleet_engine.apply(encode(FeedDelta(3, swap, [], load(0))))  # 101 inside, 100 after
    assert fleet_engine.is_up and fleet_engine.index.num_keys == (50, 50)
    with pytest.raises(FeedGapError, match="--max-index-keys"):
        fleet_engine.apply(encode(FeedDelta(4, [KeyChange("store", 0, extra[:1])], [], load(0))))
    assert not fleet_engine.is_up
