"""The router's in-flight prediction is the hit the engine's own lookup will give.

A request in flight on an engine will leave its prompt's keys in both groups. The router
scores a later request there by `reachable_hit` on the units the two share; that must equal
`find_hit` on a cache that holds exactly the shared prefix, on every geometry (EAGLE's extra
unit, coarse hits, the `P - 1` cap, a resend of the whole prompt included).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache.lookup import HitGeometry, find_hit
from engine.config import CacheConfig
from engine.feed import FeedHello, FeedLoad, FeedSnapshot
from engine.hashing import hash_prefix
from router.caches.index import EngineIndex
from router.engines import FleetEngine
from router.fleet import Fleet
from router.policies import make_policy


@st.composite
def geometries(draw) -> HitGeometry:
    unit = draw(st.sampled_from([1, 2, 4, 8]))
    block = unit * draw(st.sampled_from([1, 2, 4]))
    mamba = unit * draw(st.sampled_from([1, 2, 4, 8]))
    return HitGeometry.of(
        CacheConfig(
            block_size=block,
            mamba_block_size=mamba,
            prefix_match_unit=unit,
            dcp_size=draw(st.sampled_from([1, 1, 2])),
            eagle=draw(st.booleans()),
            partial_hits=draw(st.booleans()),
            enable_prefix_caching=draw(st.booleans()) or draw(st.booleans()),
            num_blocks=64,
        )
    )


def idle_fleet(geometry: HitGeometry) -> tuple[Fleet, FleetEngine]:
    """One engine up with nothing cached, so only the request in flight can give a hit."""
    engine = FleetEngine("http://engine")
    engine.hello = FeedHello("engine", 0, geometry, "m", 1 << 20)
    engine.index = EngineIndex(geometry)
    engine.index.apply_snapshot(FeedSnapshot(0, [], [], FeedLoad(0, 0, 0, 0.0, 0.0)))
    engine.status = "up"
    return Fleet([engine], make_policy("hybrid")), engine


@settings(max_examples=400, deadline=None)
@given(
    geometry=geometries(),
    num_shared=st.integers(0, 80),
    producer_tail=st.integers(0, 40),
    request_tail=st.integers(0, 40),
)
def test_the_in_flight_prediction_equals_the_lookup_on_the_shared_prefix(
    geometry: HitGeometry, num_shared: int, producer_tail: int, request_tail: int
) -> None:
    shared = list(range(num_shared))
    producer = [*shared, *range(10_000, 10_000 + producer_tail)]
    request = [*shared, *range(20_000, 20_000 + request_tail)]
    if not request:
        return
    fleet, engine = idle_fleet(geometry)
    if producer:
        fleet.route(producer, "m")  # in flight there until it finishes
    hashes = hash_prefix(request, geometry.match_unit)
    num_shared_units = engine.in_flight_shared(hashes)  # the producer's keys it shares
    decision = fleet.route(request, "m")
    in_flight = decision.scores[0].in_flight

    cached = set(hashes[:num_shared_units])  # what the producer leaves, in both groups
    get = dict.fromkeys(cached, True).get
    found = find_hit(geometry, get, get, hashes, len(request))
    assert in_flight == (found.length if found else 0), geometry
    if num_shared_units:
        assert decision.predicted_hit == in_flight  # nothing cached: the prediction is it


def test_an_exact_resend_with_eagle_keeps_the_extra_unit() -> None:
    """U 2, Ba 4, an exact resend of 8 tokens: the proof reads one unit past `P - 1`, so the
    hit is 6, not the 4 a prediction that forgot EAGLE's extra unit gives."""
    geometry = HitGeometry.of(
        CacheConfig(
            block_size=4,
            mamba_block_size=4,
            prefix_match_unit=2,
            eagle=True,
            partial_hits=True,
            num_blocks=64,
        )
    )
    fleet, _ = idle_fleet(geometry)
    prompt = list(range(8))
    fleet.route(prompt, "m")
    decision = fleet.route(prompt, "m")
    assert decision.scores[0].in_flight == 6 and decision.predicted_hit == 6
