"""The store keeps where each block lives (issue 49, the store and the views): ledger engines
with tiny host and disk tiers, run step by step, their batches ingested as an engine's
publisher sends them (`tier_runs`); the store's units per tier equal the engine's tiers, the
requests' hits split by tier add up to what the engine loaded, and the misses the tiers
explain carry their reasons."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.ingest.frames import apply_batch, apply_hello
from api.store.models import Attribution, HitRateBucket, Request, TierUnit
from engine.engine import Engine
from tests.api import factories, tier_runs
from workloads.misses import REASONS


def ingest(session: Session, engine: Engine, frames: list[dict]) -> None:
    hello = factories.parse(factories.hello(engine))
    apply_hello(session, hello)
    for frame in frames:
        apply_batch(session, hello, factories.parse(frame))


def missed(session: Session, engine_id: str) -> dict[str, int]:
    columns = [func.coalesce(func.sum(getattr(Attribution, f"missed_{r}")), 0) for r in REASONS]
    row = session.execute(select(*columns).where(Attribution.engine_id == engine_id)).one()
    return dict(zip(REASONS, row, strict=True))


@pytest.fixture(scope="module")
def host_and_disk(tmp_path_factory):
    return tier_runs.run("tiers-hd", 3000, tmp_path_factory.mktemp("disk"), 8192)


@pytest.fixture(scope="module")
def host_only():
    return tier_runs.run("tiers-h", 4096)


@pytest.fixture(scope="module")
def too_small():
    return tier_runs.run("tiers-small", 512)


@pytest.fixture(scope="module")
def roomy():
    return tier_runs.run("tiers-roomy", 1 << 16)


def held_now(engine: Engine) -> dict[str, set[str]]:
    """The engine's tiers as they are: each tier's unit keys."""
    stack = engine.scheduler.tiering.stack
    held = {"host": {key.hex() for key in stack.host.units}}
    if stack.disk is not None:
        held["disk"] = {key.hex() for key in stack.disk.index.records}
    return held


def stored_now(session: Session, engine_id: str) -> dict[str, set[str]]:
    rows = session.execute(
        select(TierUnit.tier, TierUnit.unit_key).where(
            TierUnit.engine_id == engine_id, TierUnit.removed_ts.is_(None)
        )
    )
    stored: dict[str, set[str]] = {}
    for tier, key in rows:
        stored.setdefault(tier, set()).add(key)
    return stored


def test_the_store_holds_each_tier_as_the_engine_does(session, host_and_disk):
    engine, frames = host_and_disk
    ingest(session, engine, frames)
    held = held_now(engine)
    assert held["host"] and held["disk"], "the run left no unit in a tier"
    assert {t: keys for t, keys in stored_now(session, engine.engine_id).items() if keys} == held
    stats = engine.scheduler.tiering.stats().stack
    removed = session.scalar(
        select(func.count()).select_from(TierUnit).where(TierUnit.removed_ts.is_not(None))
    )
    assert stats.host.num_evictions and stats.disk.num_evictions and removed


def test_requests_say_their_hit_by_tier_and_the_buckets_the_bytes_loaded(session, roomy):
    engine, frames = roomy
    ingest(session, engine, frames)
    stats = engine.scheduler.tiering.stats()
    assert stats.num_loads > 0, "the run loaded nothing"
    rows = session.scalars(select(Request)).all()
    loaded = [r for r in rows if r.hit_tokens_by_tier]
    assert len(loaded) == stats.num_loads
    for row in loaded:
        assert sum(row.hit_tokens_by_tier.values()) == row.num_cached_tokens
        assert row.hit_tokens_by_tier["host"] > 0
    assert sum(r.hit_tokens_by_tier["host"] for r in loaded) == stats.num_loaded_tokens
    assert sum(r.loaded_bytes_by_tier["host"] for r in loaded) == stats.num_loaded_bytes
    buckets = session.scalars(select(HitRateBucket)).all()
    assert sum(b.host_hit_tokens for b in buckets) == stats.num_loaded_tokens
    assert sum(b.host_loaded_bytes for b in buckets) == stats.num_loaded_bytes


def check_split(session: Session, engine_id: str) -> dict[str, int]:
    """Every attributed request's hit plus its misses is its shared prefix (or its hit);
    returns the misses by reason, summed."""
    requests = {r.arrival_index: r for r in session.scalars(select(Request))}
    for row in session.scalars(select(Attribution).where(Attribution.engine_id == engine_id)):
        hit = requests[row.arrival_index].num_cached_tokens
        total = sum(getattr(row, f"missed_{reason}") for reason in REASONS)
        assert hit + total == max(row.shared_tokens, hit)
    return missed(session, engine_id)


def test_a_prefix_host_memory_gave_up_missed_for_evicted_from_host(session, host_only):
    engine, frames = host_only
    ingest(session, engine, frames)
    assert engine.scheduler.tiering.stats().stack.host.num_evictions > 0
    reasons = check_split(session, engine.engine_id)
    assert reasons["evicted_host"] > 0
    assert reasons["evicted_disk"] == reasons["evicted_shared"] == 0  # no disk, no shared store


def test_a_prefix_the_disk_gave_up_missed_for_evicted_from_disk(session, host_and_disk):
    engine, frames = host_and_disk
    ingest(session, engine, frames)
    assert engine.scheduler.tiering.stats().stack.disk.num_evictions > 0
    reasons = check_split(session, engine.engine_id)
    assert reasons["evicted_disk"] > 0
    assert reasons["evicted_disk"] > reasons["evicted_host"]  # host memory gives up to disk


def test_a_prefix_no_tier_took_missed_for_not_admitted(session, too_small):
    """Host memory smaller than a system prompt's unit refuses them all and never gives one
    up: what the device evicted went nowhere, so it misses for `not_admitted`, never for an
    eviction from a tier."""
    engine, frames = too_small
    ingest(session, engine, frames)
    host = engine.scheduler.tiering.stats().stack.host
    assert host.num_evictions == 0 and host.num_refused > 0
    reasons = check_split(session, engine.engine_id)
    assert reasons["not_admitted"] > reasons["evicted"]
    assert reasons["evicted_host"] == reasons["evicted_disk"] == 0


def test_an_engine_without_tiers_keeps_evicted_whole(session, engine_run):
    factories.ingest(session, engine_run)
    reasons = missed(session, engine_run.engine_id)
    assert reasons["evicted"] > 0
    assert not any(reasons[r] for r in ("evicted_host", "evicted_disk", "not_admitted"))


# ---------------------------------------------------------------------------- the REST API
def test_the_api_serves_the_tiers_the_hits_by_tier_and_the_reasons(
    session, client, auth, host_and_disk, roomy
):
    engine, frames = host_and_disk
    ingest(session, engine, frames)
    base = f"/api/v1/engines/{engine.engine_id}"
    page = client.get(f"{base}/blocks/tiers", params={"limit": 10_000}, headers=auth).json()
    held = held_now(engine)
    assert {t: u["num_units"] for t, u in page["tiers"].items()} == {
        t: len(keys) for t, keys in held.items()
    }
    assert page["tiers"]["host"]["capacity_bytes"] == 3000
    assert page["tiers"]["disk"]["capacity_bytes"] == 8192
    served: dict[str, set[str]] = {}
    for unit in page["units"]:
        served.setdefault(unit["tier"], set()).add(unit["key"])
    assert served == held and page["total"] == sum(map(len, held.values()))
    disk = client.get(f"{base}/blocks/tiers", params={"tier": "disk"}, headers=auth).json()
    assert {u["key"] for u in disk["units"]} == held["disk"]
    bad = client.get(f"{base}/blocks/tiers", params={"tier": "ram"}, headers=auth)
    assert bad.status_code == 422 and "'host', 'disk' or 'shared', got 'ram'" in bad.text
    rows = client.get(f"{base}/blocks", headers=auth).json()["blocks"]
    assert rows and {row["tier"] for row in rows} == {"device"}
    reasons = client.get(f"{base}/attribution", headers=auth).json()["total"]["missed_tokens"]
    assert reasons["evicted_disk"] == missed(session, engine.engine_id)["evicted_disk"] > 0

    engine, frames = roomy
    ingest(session, engine, frames)
    base = f"/api/v1/engines/{engine.engine_id}"
    stats = engine.scheduler.tiering.stats()
    total = client.get(f"{base}/hit-rate", headers=auth).json()["total"]
    assert total["hit_tokens_by_tier"]["host"] == stats.num_loaded_tokens
    assert total["loaded_bytes_by_tier"]["host"] == stats.num_loaded_bytes
    requests = client.get(f"{base}/requests", params={"limit": 1000}, headers=auth).json()
    for request in requests["requests"]:
        by_tier = request["hit_tokens_by_tier"]
        assert sum(by_tier.values()) == request["num_cached_tokens"]
    assert sum(r["hit_tokens_by_tier"].get("host", 0) for r in requests["requests"]) == (
        stats.num_loaded_tokens
    )
