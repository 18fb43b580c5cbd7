"""The policies on candidates whose scores are known: what each one picks, and why."""

from __future__ import annotations

import pytest

from router.policies import Candidate, make_policy


def candidate(key: str, hit=0, attention=0, in_flight=0, load=0, routed=0) -> Candidate:
    return Candidate(key, hit, attention, in_flight, load, routed)


def test_hybrid_takes_the_usable_hit_where_attention_takes_the_longer_match():
    stale = candidate("a", hit=0, attention=1600)  # its state was evicted
    backed = candidate("b", hit=1536, attention=1536)
    assert make_policy("hybrid").choose([stale, backed], 1700).key == "b"
    assert make_policy("attention").choose([stale, backed], 1700).key == "a"


def test_a_hit_below_the_share_counts_as_none_so_the_fleet_spreads():
    header = candidate("a", hit=32, attention=32, routed=5)  # a chat template's header
    idle = candidate("b", routed=0)
    choice = make_policy("hybrid").choose([header, idle], 1500)
    assert choice.key == "b" and choice.reason == "least_loaded"
    everything = make_policy("hybrid", min_hit_share=0.0).choose([header, idle], 1500)
    assert everything.key == "a" and everything.reason == "hit"


def test_load_outweighs_a_shorter_hit_and_in_flight_work_counts():
    busy = candidate("a", hit=1000, load=900)
    free = candidate("b", hit=400, load=0)
    choice = make_policy("hybrid").choose([busy, free], 1200)
    assert choice.key == "b" and choice.scores == {"a": 100, "b": 400}
    producer = candidate("c", in_flight=1100, load=100)
    choice = make_policy("hybrid").choose([busy, free, producer], 1200)
    assert choice.key == "c" and choice.reason == "in_flight"


def test_ties_go_to_the_lower_load_then_the_fewer_routed():
    policy = make_policy("hybrid")
    assert policy.choose([candidate("a", load=5), candidate("b", load=1)], 100).key == "b"
    assert policy.choose([candidate("a", routed=3), candidate("b", routed=2)], 100).key == "b"


def test_round_robin_cycles_and_random_is_seeded():
    candidates = [candidate(k) for k in "cab"]
    policy = make_policy("round_robin")
    assert [policy.choose(candidates, 10).key for _ in range(4)] == ["a", "b", "c", "a"]
    picks = [make_policy("random", seed=3).choose(candidates, 10).key for _ in range(2)]
    assert picks[0] == picks[1]


def test_an_unknown_policy_or_share_is_refused_by_name():
    choices = "hybrid, hybrid_device, lmetric, attention, round_robin, random"
    with pytest.raises(ValueError, match=f"choose one of {choices}"):
        make_policy("cheapest")
    with pytest.raises(ValueError, match="--min-hit-share must lie in"):
        make_policy("hybrid", min_hit_share=1.5)


def test_a_family_whose_first_request_is_prefilling_follows_it():
    """The fleet's in-flight awareness: the second request of a family goes where the first
    is being prefilled, though that engine's queue holds the first's prefill and another
    engine is idle."""
    from engine.cache.lookup import HitGeometry
    from engine.feed import FeedHello, FeedLoad, FeedSnapshot
    from router.caches.index import EngineIndex
    from router.engines import FleetEngine
    from router.fleet import Fleet

    geometry = HitGeometry(16, 16, 16, 0, True, True)
    engines = []
    for name in ("a", "b"):
        engine = FleetEngine(f"http://{name}")
        engine.hello = FeedHello(name, 0, geometry, "m", 1 << 20)
        engine.index = EngineIndex(geometry)
        engine.index.apply_snapshot(FeedSnapshot(0, [], [], FeedLoad(0, 0, 0, 0.0, 0.0)))
        engine.status = "up"
        engines.append(engine)
    fleet = Fleet(engines, make_policy("hybrid"))
    system = list(range(2000))
    first = fleet.route([*system, 1, 2, 3], "m")
    assert first.reason == "least_loaded"
    second = fleet.route([*system, 7, 8, 9, 10], "m")
    assert second.url == first.url and second.reason == "in_flight"
    assert second.predicted_hit == 2000  # the producer's shared units, on the hit grid
    assert engines[0].load_tokens(0) + engines[1].load_tokens(0) == 2003 + 2004 - 2000
    fleet.finish(first, None)
    fleet.finish(second, None)
    assert not any(e.in_flight or e.in_flight_keys or e.in_flight_prefill for e in engines)
    stranger = fleet.route(list(range(5000, 6000)), "m")
    assert stranger.reason == "least_loaded" and stranger.url != first.url  # fewer routed
