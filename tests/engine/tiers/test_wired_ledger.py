"""The tiers wired under the device pools (issue 46), through the ledger runner: random traces
on tiny pools and tiny tiers keep every invariant after every step and equal a cache-off
engine's outputs (a restored block read wrong raises `LedgerMismatch`); a restart hits from
disk; a foreign geometry is refused; a corrupted unit file is dropped and counted; slow loads
are refused; the tiers' events and the feed."""

from __future__ import annotations

import os
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from engine.cache.eviction import EVICTION_POLICIES
from engine.config import CacheConfig, ModelConfig, SchedulerConfig, TierConfig
from engine.engine import Engine
from engine.events import TIER_MEDIA, BlockRemoved, BlockStored, UnitLoaded
from engine.feed import FeedDelta, FeedHub, FeedSink, FeedSubscriber, decode
from engine.pins.pin import PinState
from engine.request import SamplingParams
from engine.tiers.disk import SUFFIX
from engine.tiers.stack import DISK, HOST
from tests.engine.ledger_harness import Harness, Submission, sized_pools

VOCAB = 256

#: tier layouts a trace runs over: host memory only, host memory over disk, disk only
LAYOUTS = ("host", "host+disk", "disk")


@st.composite
def geometries(draw) -> CacheConfig:
    unit = draw(st.sampled_from([2, 4, 8]))
    return CacheConfig(
        block_size=unit * draw(st.sampled_from([1, 2, 4])),
        mamba_block_size=unit * draw(st.sampled_from([4, 8, 16])),
        prefix_match_unit=unit,
        partial_hits=draw(st.sampled_from([True, True, True, False])),
        junction_checkpoints=draw(st.booleans()),
        checkpoint_mode=draw(st.sampled_from(["stops", "inline"])),
        checkpoint_interval=draw(st.sampled_from([None, 0, 2 * unit])),
        eagle=draw(st.sampled_from([False] * 7 + [True])),
        dcp_size=draw(st.sampled_from([1, 1, 2])),
        eviction=draw(st.sampled_from(list(EVICTION_POLICIES))),
        num_blocks=4096,  # replaced by `tiny_pools` once the trace is known
    )


@st.composite
def workloads(draw) -> list[Submission]:
    """A few system prompts, each longer than a tiny device pool keeps beside the others,
    asked again and again with new tails, resent, extended, pinned and unpinned, aborted."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    bases = [
        [rng.randrange(VOCAB) for _ in range(rng.randint(40, 160))]
        for _ in range(rng.randint(3, 5))
    ]
    submissions: list[Submission] = []
    kinds = ["whole"] * 5 + ["share"] * 2 + ["resend", "extend", "pin", "unpin", "abort"]
    for _ in range(rng.randint(12, 30)):
        kind = rng.choice(kinds)
        base = rng.choice(bases)
        max_tokens = rng.randint(1, 6)
        previous = [s for s in submissions if s.token_ids and not s.pin and not s.extends_previous]
        if kind == "resend" and previous:
            submissions.append(Submission(list(previous[-1].token_ids), max_tokens))
        elif kind == "extend" and submissions:
            tail = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
            submissions.append(Submission(tail, max_tokens, extends_previous=True))
        elif kind == "pin":
            submissions.append(Submission(base[: rng.randint(1, len(base))], pin=True))
        elif kind == "unpin":
            submissions.append(Submission([], unpin=True))
        elif kind == "abort":
            submissions.append(Submission([], abort_after=rng.randint(0, 3)))
        else:
            shared = len(base) if kind == "whole" else rng.randint(len(base) // 2, len(base))
            tail = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 24))]
            submissions.append(Submission(base[:shared] + tail, max_tokens))
    return submissions


def tiny_pools(
    config: CacheConfig, submissions: list[Submission], slack: int, scale: int
) -> CacheConfig:
    """A Mamba pool that fits the longest request beside a full pin share and `slack` blocks
    more, so states are given up (and go down) all the time; an attention pool `scale` times
    the smallest, so a state given up still has its attention prefix on the device."""
    tight = sized_pools(config, submissions, slack)
    return CacheConfig(**{**tight.__dict__, "num_blocks": tight.num_blocks * scale})


def repeated_systems(seed: int = 0, num_systems: int = 4, num_rounds: int = 3) -> list[Submission]:
    """Rounds of each system prompt with a fresh tail: every state of a round is given up
    before the next round asks for it again."""
    rng = random.Random(seed)
    bases = [[rng.randrange(VOCAB) for _ in range(120)] for _ in range(num_systems)]
    return [
        Submission(base + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))], 2)
        for _ in range(num_rounds)
        for base in bases
    ]


def tier_config(layout: str, host_bytes: int, disk_bytes: int, directory: str) -> TierConfig:
    if layout == "host":
        return TierConfig(host_cache_bytes=host_bytes)
    return TierConfig(
        host_cache_bytes=host_bytes if layout == "host+disk" else 0,
        disk_cache_dir=directory,
        disk_cache_bytes=disk_bytes,
    )


def check_device_holds(engine: Engine) -> None:
    """No block a pin or a running request holds was given up: a materialized pin's blocks
    are pinned and its key is still an entry; every block in a table is referenced."""
    coordinator = engine.scheduler.coordinator
    pools = coordinator.pools
    for pin in engine.pins.values():
        if pin.state is not PinState.MATERIALIZED:
            continue
        for group, block_ids in pin.block_ids.items():
            assert block_ids, f"pin {pin.pin_id} holds no {group} block"
            for block_id in block_ids:
                assert pools[group].blocks[block_id].pin_cnt > 0, (pin.pin_id, group, block_id)
        entry = coordinator.mamba.pool.entries.get(pin.key)
        assert entry is not None and entry.block_id in pin.block_ids["mamba"], pin.pin_id
    for request in engine.scheduler.running:
        for group, table in coordinator.block_tables(request.request_id).items():
            for block_id in table:
                if block_id is not None:
                    assert pools[group].blocks[block_id].ref_cnt > 0, (
                        request.request_id,
                        group,
                        block_id,
                    )


def check_tiers(engine: Engine) -> None:
    stack = engine.scheduler.tiering.stack
    for tier in (stack.host, stack.disk):
        if tier is not None:
            stats = tier.stats()
            assert stats.num_bytes <= stats.capacity_bytes, stats


def outputs_equal_cache_off(requests, harness, config, scheduler, submissions) -> None:
    """The same trace on a cache-off engine samples the same tokens (an abort cuts a request,
    and the turns extending it, at a step-dependent point: those are not compared)."""
    off = CacheConfig(**{**config.__dict__, "enable_prefix_caching": False})
    base = Harness(
        Engine(off, scheduler, runner="ledger"), audit_entries=False, drain_for_pins=False
    )
    baseline = base.run(submissions)
    aborted = harness.aborted_ids | base.aborted_ids
    for ours, theirs in zip(requests, baseline, strict=True):
        if ours.prompt_token_ids == theirs.prompt_token_ids and not (
            {ours.request_id, theirs.request_id} & aborted
        ):
            assert ours.output_token_ids == theirs.output_token_ids, ours.request_id


class Corruption(NamedTuple):
    every: int  # steps between two corrupted files
    seed: int


def corrupt_a_unit_file(directory: Path, rng: random.Random) -> None:
    """Flip a byte in the second half of a unit file (its payload, past the header)."""
    files = sorted(directory.glob(f"*{SUFFIX}"))
    if not files:
        return
    path = rng.choice(files)
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data) // 2, len(data))] ^= 0xFF
    path.write_bytes(bytes(data))


#: The explicit examples' arguments: the random ones may miss a load from some tier, these not
FIXED = {
    "config": CacheConfig(block_size=8, mamba_block_size=32, prefix_match_unit=8),
    "submissions": repeated_systems(),
    "host_bytes": 2000,
    "disk_bytes": 1 << 20,
    "slack": 0,
    "scale": 4,
    "budget": 48,
    "concurrency": 1,
    "restart": False,
    "corrupt": None,
}


#: What the passing examples reached; `test_the_traces_loaded_from_each_tier` reads it.
REACHED: Counter[str] = Counter()


@settings(
    max_examples=int(os.environ.get("JUNCTION_TIER_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    config=geometries(),
    submissions=workloads(),
    layout=st.sampled_from([*LAYOUTS, "disk"]),
    host_bytes=st.sampled_from([700, 2000, 8000, 1 << 20]),
    disk_bytes=st.sampled_from([4000, 16000, 1 << 20]),
    slack=st.integers(0, 2),
    scale=st.sampled_from([1, 2, 4]),
    budget=st.sampled_from([16, 48, 200]),
    concurrency=st.integers(1, 4),
    restart=st.booleans(),
    corrupt=st.one_of(st.none(), st.builds(Corruption, st.integers(1, 8), st.integers(0, 2**16))),
)
@example(**{**FIXED, "layout": "host", "host_bytes": 1 << 20})
@example(**{**FIXED, "layout": "disk", "restart": True})
@example(
    **{**FIXED, "layout": "host+disk", "host_bytes": 700, "scale": 2, "corrupt": Corruption(8, 0)}
)
def test_random_traces_over_tiny_tiers_keep_invariants_and_equal_cache_off(
    config,
    submissions,
    layout,
    host_bytes,
    disk_bytes,
    slack,
    scale,
    budget,
    concurrency,
    restart,
    corrupt,
):
    config = tiny_pools(config, submissions, slack, scale)
    scheduler = SchedulerConfig(max_num_batched_tokens=budget)
    # with a disk, the trace's second half may run on a new engine over the same directory
    cut = len(submissions) // 2 if restart and layout != "host" else len(submissions)
    loads, num_saves, num_pinned, num_corrupt = [], 0, 0, 0
    rng = random.Random(None if corrupt is None else corrupt.seed)
    with tempfile.TemporaryDirectory() as directory:
        for part in (submissions[:cut], submissions[cut:]):
            if not part:
                continue
            tiers = tier_config(layout, host_bytes, disk_bytes, directory)
            engine = Engine(config, scheduler, runner="ledger", tiers=tiers)
            engine.check_invariants()

            def after_step(engine: Engine) -> None:
                check_device_holds(engine)
                check_tiers(engine)
                if corrupt is not None and engine.num_steps % corrupt.every == 0:
                    corrupt_a_unit_file(Path(directory), rng)

            harness = Harness(
                engine, concurrency=concurrency, on_step=after_step, drain_for_pins=False
            )
            requests = harness.run(part)
            engine.check_invariants()
            stats = engine.scheduler.tiering.stats()
            part_loads = [e for e in engine.sink.events if isinstance(e, UnitLoaded)]
            assert len(part_loads) == stats.num_loads
            for load in part_loads:
                assert set(load.media) <= {HOST, DISK}
                assert len(load.media) == len(load.unit_hashes) > 0
            assert sum(r.num_loaded_tokens for r in requests) == stats.num_loaded_tokens
            # each load's tiers' parts add up to it (what the store splits hits by)
            for load in part_loads:
                assert sum(load.bytes_by_medium.values()) == load.num_bytes
            assert sum(stats.loaded_tokens_by_medium.values()) == stats.num_loaded_tokens
            if corrupt is None:  # else a chain read up to a corrupt unit loads nothing
                read = Counter(medium for load in part_loads for medium in load.media)
                assert stats.stack.host.num_hits == read[HOST]
                if stats.stack.disk is not None:
                    assert stats.stack.disk.num_hits == read[DISK]
            held, _ = replay_tier_events(tier_events_of(engine))
            assert_held_as_announced(engine, held)
            outputs_equal_cache_off(requests, harness, config, scheduler, part)
            loads += part_loads
            num_saves += stats.num_saves
            num_corrupt += 0 if stats.stack.disk is None else stats.stack.disk.num_corrupt
            num_pinned += any(p.state is PinState.MATERIALIZED for p in engine.pins.values())
    media = {medium for load in loads for medium in load.media}
    reached = {
        "saved": num_saves > 0,
        "loaded": bool(loads),
        "loaded from host": HOST in media,
        "loaded from disk": DISK in media,
        "loaded after a restart": cut < len(submissions) and bool(part_loads),
        "pinned": num_pinned > 0,
        "corrupt unit dropped": num_corrupt > 0,
    }
    for name, value in reached.items():
        event(f"{name}: {value}")
    REACHED["examples"] += 1
    REACHED.update(name for name, value in reached.items() if value)


def test_the_traces_loaded_from_each_tier():
    """Runs after the property test (file order): some traces loaded from host memory and
    some from disk, so a wiring that never loads cannot pass it by never reaching a load."""
    if REACHED["examples"] < 30:
        pytest.skip(f"only {REACHED['examples']} property examples ran here")
    names = (
        "saved",
        "loaded",
        "loaded from host",
        "loaded from disk",
        "loaded after a restart",
        "corrupt unit dropped",
    )
    for name in names:
        assert REACHED[name] > 0, (name, dict(REACHED))


# ---------------------------------------------------------------------- fixed traces

CACHE = CacheConfig(block_size=16, mamba_block_size=64, num_blocks=48, num_mamba_blocks=10)
NUM_SYSTEMS, SYSTEM_LEN = 5, 256


def systems(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(SYSTEM_LEN)] for _ in range(NUM_SYSTEMS)]


def prompts(seed: int, rounds: int = 2) -> list[list[int]]:
    """Each system prompt with a tail, then again with others: more system prompts than the
    device pools hold, so their states go down before they are asked for again."""
    rng = random.Random(seed + 1)
    out = []
    for _ in range(rounds):
        for system in systems():
            out.append(system + [rng.randrange(VOCAB) for _ in range(rng.randint(3, 20))])
    return out


def run(engine: Engine, token_lists: list[list[int]], max_tokens: int = 3) -> list:
    """One request at a time, invariants after every step; returns the requests."""
    requests = []
    for token_ids in token_lists:
        request = engine.add_request(token_ids, SamplingParams(max_tokens=max_tokens))
        while engine.has_unfinished():
            engine.step()
            engine.check_invariants()
        requests.append(request)
    return requests


def cache_off_outputs(token_lists: list[list[int]], cache: CacheConfig = CACHE) -> list:
    off = CacheConfig(**{**cache.__dict__, "enable_prefix_caching": False})
    return [r.output_token_ids for r in run(Engine(off, runner="ledger"), token_lists)]


def disk_tiers(directory: Path, host_bytes: int = 0) -> TierConfig:
    return TierConfig(
        host_cache_bytes=host_bytes, disk_cache_dir=str(directory), disk_cache_bytes=1 << 24
    )


def num_hit_tokens(requests) -> int:
    return sum(r.num_cached_tokens for r in requests)


def test_a_restart_on_the_same_disk_directory_hits_from_disk(tmp_path):
    first = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path))
    run(first, prompts(0, rounds=1))
    assert first.scheduler.tiering.stats().num_saves > 0
    assert list(tmp_path.glob(f"*{SUFFIX}"))
    del first

    again = prompts(7, rounds=1)
    restarted = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path))
    assert len(restarted.scheduler.tiering.stack.disk.index) > 0
    requests = run(restarted, again)
    device_only = run(Engine(CACHE, runner="ledger"), again)
    stats = restarted.scheduler.tiering.stats()
    assert stats.num_loads > 0
    loads = [e for e in restarted.sink.events if isinstance(e, UnitLoaded)]
    assert DISK in {medium for load in loads for medium in load.media}
    assert num_hit_tokens(requests) > num_hit_tokens(device_only)
    assert [r.output_token_ids for r in requests] == cache_off_outputs(again)


@pytest.mark.parametrize(
    "other",
    [
        {"cache": CacheConfig(**{**CACHE.__dict__, "block_size": 32})},
        {"cache": CacheConfig(**{**CACHE.__dict__, "mamba_block_size": 32})},
        {"model": ModelConfig(name="another-model")},
        {"model": ModelConfig(num_layers=6)},
        {"runner": "null"},
    ],
    ids=["block_size", "mamba_block_size", "model", "shape", "runner"],
)
def test_another_geometry_on_the_directory_is_refused(tmp_path, other):
    """Refused naming the option, and the directory is left as it was: the engine it belongs
    to still finds its units."""
    run(Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path)), prompts(0, rounds=1))
    files = sorted(tmp_path.glob(f"*{SUFFIX}"))
    assert files
    with pytest.raises(ValueError, match="--disk-cache-dir"):
        Engine(
            other.get("cache", CACHE),
            model_config=other.get("model"),
            runner=other.get("runner", "ledger"),
            tiers=disk_tiers(tmp_path),
        )
    assert sorted(tmp_path.glob(f"*{SUFFIX}")) == files
    again = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path))
    assert len(again.scheduler.tiering.stack.disk.index) == len(files)


def test_a_corrupted_unit_file_is_dropped_counted_and_never_read(tmp_path):
    run(Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path)), prompts(0, rounds=1))
    files = sorted(tmp_path.glob(f"*{SUFFIX}"))
    assert files
    for path in files:  # every unit file: the first read of any of them finds it corrupt
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 8] = bytes(b ^ 0x5A for b in data[middle : middle + 8])
        path.write_bytes(bytes(data))

    again = prompts(7, rounds=1)
    restarted = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path))
    requests = run(restarted, again)
    stats = restarted.scheduler.tiering.stats()
    assert stats.stack.disk.num_corrupt > 0
    assert stats.num_loads == 0
    assert [r.output_token_ids for r in requests] == cache_off_outputs(again)


def test_one_corrupted_unit_file_is_dropped_and_the_rest_still_load(tmp_path):
    run(Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path)), prompts(0, rounds=1))
    files = sorted(tmp_path.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_size)
    victim = files[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    again = prompts(7, rounds=1)
    restarted = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path))
    requests = run(restarted, again)
    stats = restarted.scheduler.tiering.stats()
    assert stats.stack.disk.num_corrupt == 1
    # deleted when found corrupt; the unit may have been written again, whole, since
    assert not victim.exists() or victim.read_bytes() != bytes(data)
    assert stats.num_loads > 0
    assert [r.output_token_ids for r in requests] == cache_off_outputs(again)


# ---------------------------------------------------------------------- admission by cost


def loading_engine(host_bytes_per_s: float) -> Engine:
    tiers = TierConfig(
        host_cache_bytes=1 << 24,
        host_bytes_per_s=host_bytes_per_s,
        disk_bytes_per_s=1e9,
        prefill_tokens_per_s=1e9,
    )
    return Engine(CACHE, runner="ledger", tiers=tiers)


def test_a_load_slower_than_prefilling_is_refused():
    engine = loading_engine(host_bytes_per_s=1.0)
    token_lists = prompts(0)
    requests = run(engine, token_lists)
    stats = engine.scheduler.tiering.stats()
    assert stats.num_saves > 0
    # one count per lookup refused, however many of its positions the tiers hold: the second
    # round's requests look up once each (one request at a time, admitted at once)
    assert 0 < stats.num_refused_slow <= NUM_SYSTEMS
    assert stats.num_loads == 0
    assert sum(r.num_loaded_tokens for r in requests) == 0
    assert [r.output_token_ids for r in requests] == cache_off_outputs(token_lists)


def test_a_fast_host_tier_is_loaded_from():
    engine = loading_engine(host_bytes_per_s=1e18)
    token_lists = prompts(0)
    requests = run(engine, token_lists)
    stats = engine.scheduler.tiering.stats()
    assert stats.num_refused_slow == 0
    assert stats.num_loads > 0
    # the bytes read out of host memory are the loads' (a unit kept fresh there is not read)
    assert stats.stack.host.bytes_out == stats.num_loaded_bytes
    assert sum(r.num_loaded_tokens for r in requests) == stats.num_loaded_tokens > 0
    assert [r.output_token_ids for r in requests] == cache_off_outputs(token_lists)


# ---------------------------------------------------------------------- events and feed


def replay_tier_events(events) -> tuple[dict[tuple[str, str], set[str]], int]:
    """What each tier holds by the events, per group (a store of a key the tier held, or a
    removal of one it did not, fails), and how many keys moved down: removed from host memory
    while not on disk, their next event in the group a store on disk."""
    held: dict[tuple[str, str], set[str]] = {
        (medium, group): set() for medium in (HOST, DISK) for group in ("attention", "mamba")
    }
    num_moves = 0
    for index, e in enumerate(events):
        (key,) = e.block_hashes
        keys = held[e.medium, e.group]
        if isinstance(e, BlockStored):
            assert key not in keys, (index, e)
            keys.add(key)
            continue
        assert key in keys, (index, e)
        keys.remove(key)
        if e.medium != HOST or key in held[DISK, e.group]:
            continue
        after = (
            (type(later), later.medium)
            for later in events[index + 1 :]
            if later.group == e.group and later.block_hashes == e.block_hashes
        )
        num_moves += next(after, None) == (BlockStored, DISK)
    return held, num_moves


def tier_events_of(engine: Engine) -> list:
    return [
        e
        for e in engine.sink.events
        if isinstance(e, BlockStored | BlockRemoved) and e.medium in TIER_MEDIA
    ]


def assert_held_as_announced(engine: Engine, held: dict[tuple[str, str], set[str]]) -> None:
    stack = engine.scheduler.tiering.stack
    for group in ("attention", "mamba"):
        assert held[HOST, group] == {key.hex() for key in stack.host.units}
        disk = set() if stack.disk is None else stack.disk.index.records
        assert held[DISK, group] == {key.hex() for key in disk}


def test_a_restarted_engine_announces_the_units_it_found_on_disk(tmp_path):
    """A new epoch's stream tells what the disk tier holds from its start: the units found on
    disk are stored before any of them is removed or loaded."""
    first = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path, host_bytes=3000))
    run(first, prompts(0, rounds=1))
    found = {key.hex() for key in first.scheduler.tiering.stack.disk.index.records}
    assert found
    restarted = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path, host_bytes=3000))
    stored = {k for e in tier_events_of(restarted) for k in e.block_hashes}
    assert stored == found
    run(restarted, prompts(7))
    held, _ = replay_tier_events(tier_events_of(restarted))
    assert_held_as_announced(restarted, held)
    assert restarted.scheduler.tiering.stats().num_loads > 0


def test_tier_events_carry_their_medium_and_no_block_ids(tmp_path):
    host_bytes = 3000  # a few units: the rest are demoted to disk
    engine = Engine(CACHE, runner="ledger", tiers=disk_tiers(tmp_path, host_bytes))
    run(engine, prompts(0))
    events = engine.sink.events
    tier_events = [
        e for e in events if isinstance(e, BlockStored | BlockRemoved) and e.medium in TIER_MEDIA
    ]
    assert {e.medium for e in tier_events} == {HOST, DISK}
    assert all(e.block_ids == [] for e in tier_events)
    device = [e for e in events if isinstance(e, BlockStored) and e.medium not in TIER_MEDIA]
    assert device and all(e.block_ids for e in device)

    stats = engine.scheduler.tiering.stats()
    assert stats.stack.num_demoted > 0
    held, num_moves = replay_tier_events(tier_events)
    assert num_moves > 0
    assert_held_as_announced(engine, held)

    loads = [e for e in events if isinstance(e, UnitLoaded)]
    assert len(loads) == stats.num_loads > 0
    for load in loads:
        assert len(load.unit_hashes) == len(load.media)
        assert load.token_range[0] < load.token_range[1]
        assert load.num_bytes > 0


def test_the_feed_announces_tier_units_apart_from_device_keys(tmp_path):
    """Device keys go in a delta's `changes` as before; each unit a tier stores or gives up
    goes in its `tiers`, once (not once per group), with its medium, range and bytes: replayed
    in order, they are what each tier holds."""
    hub = FeedHub()
    engine = Engine(
        CACHE,
        runner="ledger",
        sink=FeedSink(hub, keep_events=True),
        tiers=disk_tiers(tmp_path, host_bytes=3000),
    )
    hub.attach(engine)
    subscriber = FeedSubscriber(lambda: None)
    hub.subscribe(engine, subscriber)
    run(engine, prompts(0))
    events = engine.sink.events
    assert any(isinstance(e, BlockStored) and e.medium in TIER_MEDIA for e in events)
    expected = Counter(
        ("store" if isinstance(e, BlockStored) else "remove", e.group_idx, tuple(e.block_hashes))
        for e in events
        if isinstance(e, BlockStored | BlockRemoved) and e.medium not in TIER_MEDIA
    )
    announced: Counter[tuple[str, int, tuple[str, ...]]] = Counter()
    held: dict[str, dict[bytes, tuple]] = {HOST: {}, DISK: {}}
    for frame in map(decode, subscriber.take()):
        if isinstance(frame, FeedDelta):
            announced.update((c.op, c.group, tuple(k.hex() for k in c.keys)) for c in frame.changes)
            for unit in frame.tiers:
                if unit.op == "store":
                    assert unit.key not in held[unit.medium]
                    held[unit.medium][unit.key] = (
                        unit.parent,
                        unit.num_bytes,
                        unit.start,
                        unit.end,
                    )
                else:
                    del held[unit.medium][unit.key]
    assert announced == expected
    stack = engine.scheduler.tiering.stack
    assert held[HOST] == {k: tuple(r) for k, r in stack.host.index.records.items()}
    assert held[DISK] == {k: tuple(r) for k, r in stack.disk.index.records.items()}
    assert held[HOST] and held[DISK]
    assert engine.scheduler.tiering.stats().num_loads > 0
