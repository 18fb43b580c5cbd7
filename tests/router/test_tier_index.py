"""The router, fed only by an engine's cache feed, predicts the hit the engine takes with its
tiers below the device: the device's own lookup, then the deepest unit its host or disk tier
holds that the engine would load (`Tiering.find`, loads slower than their prefill refused).

Random traces of system prompts (more than the tiny device pools keep) run through a ledger
engine with a host tier (over a disk tier, or not) whose rates price its loads; after every
request the feed's frames go to a `FleetEngine`, whose tier sets must equal the stack's, and
for random probes the router's predicted hit (`Fleet.route`, hybrid) must equal the device
lookup extended by `Tiering.find`.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, TierConfig
from engine.engine import Engine
from engine.feed import FeedHub, FeedSink, FeedSubscriber
from engine.hashing import hash_prefix
from engine.request import SamplingParams
from router.engines import FleetEngine
from router.fleet import Fleet
from router.policies import make_policy

VOCAB = 256
MAX_TOKENS = 224  # the longest prompt + output below


def _expected(engine: Engine, prompt: list[int]) -> int:
    """The engine's own hit for `prompt` now: the device's lookup, then the tiers' plan."""
    scheduler = engine.scheduler
    hashes = hash_prefix(prompt, scheduler.coordinator.unit)
    hit = scheduler.coordinator.lookup(hashes, len(prompt), True)
    plan = scheduler.tiering.find(hashes, len(prompt), hit.length)
    return plan.length if plan is not None else hit.length


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    unit=st.sampled_from([4, 8, 16]),
    partial=st.booleans(),
    disk=st.booleans(),
    host_rate=st.sampled_from([1e3, 3e4, 1e9]),
)
def test_the_router_predicts_the_engines_hit_with_its_tiers(
    tmp_path_factory, seed, unit, partial, disk, host_rate
):
    rng = random.Random(seed)
    directory = str(tmp_path_factory.mktemp("disk")) if disk else None
    tiers = TierConfig(
        host_cache_bytes=rng.choice([2000, 6000, 1 << 20]),
        disk_cache_dir=directory,
        disk_cache_bytes=1 << 22 if disk else 0,
        host_bytes_per_s=host_rate,
        disk_bytes_per_s=host_rate / 2,
        prefill_tokens_per_s=1000.0,
    )
    hub = FeedHub()
    block, mamba = unit * rng.choice([1, 2]), unit * 4
    cache = CacheConfig(  # one request of the longest with a little to spare: they evict
        block_size=block,
        mamba_block_size=mamba,
        prefix_match_unit=unit,
        partial_hits=partial,
        num_blocks=-(-MAX_TOKENS // block) + 8,
        num_mamba_blocks=-(-MAX_TOKENS // mamba) + 12,
    )
    engine = Engine(cache, runner="ledger", sink=FeedSink(hub, keep_events=False), tiers=tiers)
    assert engine.price_tier_loads() is not None
    hub.attach(engine, "m")
    subscriber = FeedSubscriber(lambda: None)
    fleet_engine = FleetEngine("http://engine")
    fleet = Fleet([fleet_engine], make_policy("hybrid", min_hit_share=0.0), running_cost=0)
    for frame in hub.subscribe(engine, subscriber):
        fleet_engine.apply(frame)
    systems = [[rng.randrange(VOCAB) for _ in range(rng.randint(60, 200))] for _ in range(5)]
    for _ in range(rng.randint(8, 20)):
        prompt = rng.choice(systems) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
        engine.add_request(prompt, SamplingParams(max_tokens=2))
        while engine.has_unfinished():
            engine.step()
        for frame in subscriber.take():
            fleet_engine.apply(frame)
        stack = engine.scheduler.tiering.stack
        index = fleet_engine.index
        assert set(index.tiers["host"]) == set(stack.host.index.records)
        on_disk = set() if stack.disk is None else set(stack.disk.index.records)
        assert set(index.tiers["disk"]) == on_disk
        for probe in [*(s[: rng.randint(1, len(s))] + [7] for s in systems), prompt]:
            decision = fleet.route(probe, "m")
            fleet.fail(decision, "a probe, never sent")  # finished, it would be expected there
            expected = _expected(engine, probe)
            assert decision.predicted_hit == expected, (probe[:4], len(probe))
            (score,) = decision.scores
    assert fleet_engine.rates.host_bytes_per_s == host_rate
