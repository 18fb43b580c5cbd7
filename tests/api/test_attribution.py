"""Miss attribution in the store, on both backends, fed a real ledger engine's events: the
split's arithmetic, pending until the earlier arrivals finish, a new epoch's flush, the salt,
and the bounds on the units kept."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.attribution import unit_salt
from api.attribution.record import AttributionConfig
from api.attribution.shared_units import prune
from api.attribution.unit_salt import salted_chain
from api.ingest.frames import apply_batch, apply_hello
from api.settings import Settings
from api.store.models import Attribution, AttributionSalt, PendingAttribution, Request, SharedUnit
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from tests.api import factories
from workloads.misses import REASONS, HitGrid, MatchStop, split_misses

FINE = HitGrid(unit=16, eagle=False, partial_hits=True, alignment=16)


# ---------------------------------------------------------------------------- the split
def test_the_split_covers_hit_to_shared_once_whatever_the_inputs():
    rng = random.Random(0)
    for _ in range(2000):
        cuts = sorted(rng.randrange(0, 40) * 16 for _ in range(4))
        hit, attention, proof, limit = cuts
        stop = MatchStop("x", proof, limit, rng.randrange(0, 40) * 16)
        shared, finished = rng.randrange(0, 40) * 16, rng.randrange(0, 40) * 16
        geometry = FINE._replace(partial_hits=rng.random() < 0.5, alignment=64)
        now = rng.choice((None, rng.randrange(0, 40) * 16))  # N: finished in its own epoch
        missed = split_misses(hit, attention, stop, shared, finished, geometry, now)
        assert set(missed) == set(REASONS) and min(missed.values()) >= 0
        assert hit + sum(missed.values()) == max(shared, hit)
        assert missed["copy_pending"] == 0


@pytest.mark.parametrize(
    ("hit", "attention", "stop", "shared", "finished", "expected"),
    [
        (512, 592, MatchStop("no_state", 592, 640), 592, 592, {"no_state": 80}),
        (0, 0, MatchStop("attention_ended", 0, 640), 592, 592, {"evicted": 592}),
        (0, 0, MatchStop("attention_ended", 0, 640), 592, 0, {"in_flight": 592}),
        (0, 0, MatchStop("in_flight", 0, 640, 320), 592, 0, {"in_flight": 592}),
        (0, 0, MatchStop("attention_ended", 0, 640), 592, 320, {"evicted": 320, "in_flight": 272}),
        (624, 624, MatchStop("held_back", 624, 624), 640, 640, {"held_back": 16}),
        (576, 576, MatchStop("held_back", 592, 640), 592, 592, {"held_back": 16}),  # EAGLE
        (600, 600, MatchStop("held_back", 600, 600), 592, 592, {}),  # hit beyond the shared
    ],
)
def test_the_split_by_case(hit, attention, stop, shared, finished, expected):
    missed = split_misses(hit, attention, stop, shared, finished, FINE)
    assert missed == dict.fromkeys(REASONS, 0) | expected


def test_units_finished_only_before_a_restart_miss_for_restarted():
    stop = MatchStop("attention_ended", 0, 640)
    missed = split_misses(0, 0, stop, 592, 592, FINE, finished_this_epoch=320)
    assert missed == dict.fromkeys(REASONS, 0) | {"evicted": 320, "restarted": 272}
    missed = split_misses(0, 0, stop, 592, 320, FINE, finished_this_epoch=0)
    assert missed == dict.fromkeys(REASONS, 0) | {"restarted": 320, "in_flight": 272}


def test_coarse_hits_hold_back_what_lies_above_the_grid():
    coarse = FINE._replace(partial_hits=False, alignment=64)
    missed = split_misses(0, 0, MatchStop("attention_ended", 0, 640), 592, 592, coarse)
    assert missed == dict.fromkeys(REASONS, 0) | {"evicted": 576, "held_back": 16}


# ---------------------------------------------------------------------------- in the store
@pytest.fixture(scope="module")
def ragged_run() -> Engine:
    """A ledger engine whose requests finish out of their arrival order: long ones arrive
    first, so the short ones behind them wait to be attributed."""
    rng = random.Random(5)
    engine = Engine(CacheConfig(), SchedulerConfig(), runner="ledger", engine_id="ragged")
    prefix = factories.tokens(rng, 300)
    for wave in range(3):
        for index, max_tokens in enumerate((24, 2, 3, 1)):
            prompt = prefix + factories.tokens(rng, 20 + 10 * index)
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens), f"w{wave}-{index}")
        engine.run_until_done()
    return engine


def rows_by_index(session: Session, model) -> dict[int, object]:
    query = select(model).execution_options(populate_existing=True)
    return {row.arrival_index: row for row in session.scalars(query)}


def test_requests_wait_for_their_earlier_arrivals_then_are_attributed(session, ragged_run):
    """Batch by batch, a request is attributed exactly when some event's
    `oldest_unfinished_index` has passed its arrival index, pending until then."""
    hello = factories.parse(factories.hello(ragged_run))
    apply_hello(session, hello)
    oldest, finished, num_pending_seen = 0, [], 0
    for frame in factories.batches(ragged_run, factories.event_dicts(ragged_run), size=4):
        apply_batch(session, hello, factories.parse(frame))
        for event in frame["events"]:
            if event["type"] == "RequestFinished":
                finished.append(event["arrival_index"])
                oldest = max(oldest, event["oldest_unfinished_index"])
        done, pending = (
            rows_by_index(session, Attribution),
            rows_by_index(session, PendingAttribution),
        )
        assert set(done) == {i for i in finished if i < oldest}
        assert set(pending) == {i for i in finished if i >= oldest}
        num_pending_seen += len(pending)
    assert num_pending_seen > 0, "the run never finished a request before an earlier one"
    requests = {r.arrival_index: r for r in session.scalars(select(Request))}
    for index, row in rows_by_index(session, Attribution).items():
        request = requests[index]
        missed = sum(getattr(row, f"missed_{reason}") for reason in REASONS)
        assert request.num_cached_tokens + missed == max(
            row.shared_tokens, request.num_cached_tokens
        )
    assert any(row.shared_tokens for row in rows_by_index(session, Attribution).values())


def test_a_new_epoch_attributes_what_the_old_one_left_pending(session, ragged_run):
    hello = factories.parse(factories.hello(ragged_run))
    apply_hello(session, hello)
    frames = factories.batches(ragged_run, factories.event_dicts(ragged_run), size=4)
    for frame in frames:
        apply_batch(session, hello, factories.parse(frame))
        if session.scalar(select(func.count()).select_from(PendingAttribution)):
            break
    else:
        pytest.fail("no batch left a request pending")
    apply_hello(session, factories.parse(factories.hello(ragged_run, epoch=ragged_run.epoch + 1)))
    assert session.scalar(select(func.count()).select_from(PendingAttribution)) == 0
    finished = session.scalar(select(func.count()).select_from(Request))
    assert session.scalar(select(func.count()).select_from(Attribution)) == finished


def test_the_store_keeps_salted_hashes_with_its_own_salt_or_the_setting(session, engine_run):
    factories.ingest(session, engine_run)
    stored = set(session.scalars(select(SharedUnit.hash)))
    salt = session.scalar(select(AttributionSalt.salt))
    assert len(salt) == 32
    chains = [e.unit_hashes for e in engine_run.sink.events if getattr(e, "unit_hashes", "")]
    raw = {
        int.from_bytes(bytes.fromhex(c[i : i + 16]), signed=True)
        for c in chains
        for i in range(0, len(c), 16)
    }
    assert stored and not stored & raw
    assert stored == {h for c in chains for h in salted_chain(c, salt)}
    assert unit_salt.store_salt(session) == salt  # made once, then read
    secret = AttributionConfig.from_settings(
        Settings(_env_file=None, attribution_salt="a deployment's own secret salt")
    )
    assert set(salted_chain(chains[0], secret.salt)).isdisjoint(stored)


def test_units_past_the_window_or_the_cap_are_pruned_in_batches(session, engine_run):
    factories.ingest(session, engine_run)

    def count() -> int:
        return session.scalar(select(func.count()).select_from(SharedUnit))

    total = count()
    assert total > 20
    newest = session.scalar(select(func.max(SharedUnit.last_seen_ts)))
    assert prune(session, engine_run.engine_id, newest, 1e9, 10**6) == 0
    assert prune(session, engine_run.engine_id, newest, 1e9, 20, check_cap=True) == total - 20
    assert count() == 20
    kept = list(session.scalars(select(SharedUnit.last_seen_ts)))
    gone = prune(session, engine_run.engine_id, newest + 10, 5, 20)
    assert gone == sum(1 for ts in kept if ts < newest + 5) and count() == 20 - gone


def test_bad_attribution_settings_name_their_variable():
    with pytest.raises(ValidationError, match="JUNCTION_ATTRIBUTION_WINDOW_S must be positive"):
        Settings(_env_file=None, attribution_window_s=0)
    with pytest.raises(ValidationError, match="JUNCTION_ATTRIBUTION_MAX_UNITS must be positive"):
        Settings(_env_file=None, attribution_max_units=-1)
    with pytest.raises(ValidationError, match="JUNCTION_ATTRIBUTION_SALT must have at least 16"):
        Settings(_env_file=None, attribution_salt="short")
    assert "a deployment" not in repr(
        Settings(_env_file=None, attribution_salt="a deployment salt")
    )
