"""Retention (`api.retention`) on both backends: each rule, chunking, idempotence, the fleet's
advisory lock, the periodic task, and a property: what the kept window totals never changes."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from sqlalchemy import delete, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from api import retention
from api.attribution import hit_rate
from api.attribution.hit_rate import COUNTERS
from api.ingest.frames import apply_batch, apply_hello
from api.retention import Pruned
from api.settings import Settings
from api.state import AppState
from api.store import bulk
from api.store.db import make_engine, make_sessionmaker
from api.store.models import (
    Attribution,
    Engine,
    EventBatch,
    HitRateBucket,
    PendingAttribution,
    Request,
    utcnow,
)
from tests.api import factories
from tests.api.conftest import TOKEN

NOW = datetime(2026, 12, 1, tzinfo=UTC)
NOW_S = NOW.timestamp()
HOUR = 3600


def rules(database_url: str, **overrides) -> Settings:
    """Settings whose every rule is off unless `overrides` turns it on (huge windows, caps)."""
    values = {
        "retention_batches_s": 1e9,
        "retention_batches_per_engine": 10**9,
        "retention_requests_s": 1e9,
        "retention_requests_per_engine": 10**9,
        "retention_rollup_after_s": 1e9,
        "retention_rollup_bucket_s": HOUR,
        "retention_buckets_s": 2e9,
    }
    return Settings(
        _env_file=None,
        database_url=database_url,
        api_token=TOKEN,
        hit_rate_bucket_s=60,
        **values | overrides,
    )


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    db = make_engine(rules(database_url).database_url)
    yield make_sessionmaker(db)
    db.dispose()


# ---------------------------------------------------------------------------- rows
def add_engine(session: Session, engine_id: str = "e", epoch: int = 1) -> None:
    session.add(Engine(engine_id=engine_id, epoch=epoch, next_seq=0, geometry={}, model={}))
    session.flush()


def add_batch(
    session: Session,
    engine_id: str,
    seq: int,
    age_s: float = 0.0,
    epoch: int = 1,
    now: datetime = NOW,
) -> None:
    received = now - timedelta(seconds=age_s)
    session.add(
        EventBatch(
            engine_id=engine_id,
            epoch=epoch,
            seq=seq,
            ts=received.timestamp(),
            received_at=received,
            num_events=0,
            events=[],
        )
    )


def add_request(
    session: Session,
    engine_id: str,
    index: int,
    finished_ts: float,
    epoch: int = 1,
    pending: bool = False,
) -> None:
    """A request, and its attribution (or, when `pending`, its pending row)."""
    session.add(
        Request(
            engine_id=engine_id,
            request_id=f"r{index}",
            epoch=epoch,
            num_prompt_tokens=100,
            num_cached_tokens=10,
            hit_tokens_by_group={"attention": 10},
            num_computed_tokens=90,
            num_output_tokens=4,
            chunks=[],
            chunk_stop_reasons=[],
            checkpoints=[],
            num_preemptions=0,
            finish_reason="length",
            arrival_ts=finished_ts - 1,
            first_token_ts=None,
            finished_ts=finished_ts,
            ttft_s=None,
            arrival_index=index,
        )
    )
    key = {"engine_id": engine_id, "epoch": epoch, "arrival_index": index}
    if pending:
        session.add(
            PendingAttribution(
                **key,
                num_prompt_tokens=100,
                num_cached_tokens=10,
                attention_hit_tokens=10,
                match_stop={},
                arrival_ts=finished_ts - 1,
                finished_ts=finished_ts,
                units=b"\0" * 8,
            )
        )
    else:
        session.add(Attribution(**key, shared_tokens=50, oracle_tokens=40))


def add_bucket(session: Session, engine_id: str, start: int, bucket_s: int = 60, n: int = 1):
    counters = {name: n * (i + 1) for i, name in enumerate(COUNTERS)}
    session.add(
        HitRateBucket(engine_id=engine_id, bucket_start=start, bucket_s=bucket_s, **counters)
    )


def count(sessions: sessionmaker[Session], model, *where) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def bucket_rows(sessions: sessionmaker[Session], engine_id: str = "e") -> list[HitRateBucket]:
    with sessions() as session:
        stmt = select(HitRateBucket).where(HitRateBucket.engine_id == engine_id)
        return list(session.scalars(stmt.order_by(HitRateBucket.bucket_start)))


def totals(rows) -> dict[str, int]:
    return {name: sum(getattr(row, name) for row in rows) for name in COUNTERS}


# ---------------------------------------------------------------------------- event batches
def test_batches_past_their_window_go(sessions, database_url):
    with sessions() as session:
        add_engine(session)
        for seq, age in enumerate((500, 200, 101, 99, 0)):
            add_batch(session, "e", seq, age)
        session.commit()
    pruned = retention.prune(sessions, rules(database_url, retention_batches_s=100), NOW)
    assert pruned == Pruned(batches_expired=3)
    with sessions() as session:
        assert list(session.scalars(select(EventBatch.seq).order_by(EventBatch.seq))) == [3, 4]


def test_batches_beyond_the_per_engine_cap_go(sessions, database_url):
    with sessions() as session:
        add_engine(session, "a")
        add_engine(session, "b")
        for seq in range(10):
            add_batch(session, "a", seq)
        for seq in range(3):
            add_batch(session, "b", seq)
        session.commit()
    pruned = retention.prune(sessions, rules(database_url, retention_batches_per_engine=4), NOW)
    assert pruned == Pruned(batches_over_cap=6)
    with sessions() as session:
        kept = session.execute(select(EventBatch.engine_id, EventBatch.seq)).all()
    assert sorted(kept) == [("a", 6), ("a", 7), ("a", 8), ("a", 9), ("b", 0), ("b", 1), ("b", 2)]


def test_batches_of_replaced_epochs_go_and_events_reads_still_work(
    client, settings, session, engine_run
):
    """A restarted engine (a newer epoch's hello): its old epoch's batches go, the current
    epoch's stay and `/events` reads them as before."""
    sessions = make_sessionmaker(session.get_bind())
    factories.ingest(session, engine_run)
    old = factories.parse(factories.hello(engine_run))
    new = factories.parse(factories.hello(engine_run, epoch=old.epoch + 1))
    apply_hello(session, new)
    frames = factories.batches(engine_run, factories.event_dicts(engine_run), epoch=new.epoch)
    for frame in frames[:3]:
        apply_batch(session, new, factories.parse(frame))
    before = client.get("/api/v1/events", params={"engine_id": engine_run.engine_id}).json()
    pruned = retention.prune(sessions, rules(settings.database_url), NOW)
    assert pruned.batches_of_old_epochs == len(
        factories.batches(engine_run, factories.event_dicts(engine_run))
    )
    assert pruned.num_rows == pruned.batches_of_old_epochs
    assert count(sessions, EventBatch, EventBatch.epoch == old.epoch) == 0
    after = client.get("/api/v1/events", params={"engine_id": engine_run.engine_id}).json()
    assert after == before and [b["seq"] for b in after["batches"]] == [0, 1, 2]
    page = client.get(
        "/api/v1/events", params={"engine_id": engine_run.engine_id, "epoch": old.epoch}
    ).json()
    assert page["batches"] == [] and page["next_after_seq"] == -1
    assert client.get("/api/v1/events").json()["batches"] == before["batches"]


# ---------------------------------------------------------------------------- requests
def test_requests_past_their_window_go_with_their_attributions(sessions, database_url):
    with sessions() as session:
        add_engine(session)
        add_request(session, "e", 0, NOW_S - 500)
        add_request(session, "e", 1, NOW_S - 300, pending=True)
        add_request(session, "e", 2, NOW_S - 50)
        add_request(session, "e", 3, NOW_S - 10, pending=True)
        session.commit()
    pruned = retention.prune(sessions, rules(database_url, retention_requests_s=100), NOW)
    assert pruned == Pruned(requests_expired=2, attributions=2)
    with sessions() as session:
        assert sorted(session.scalars(select(Request.arrival_index))) == [2, 3]
        assert list(session.scalars(select(Attribution.arrival_index))) == [2]
        assert list(session.scalars(select(PendingAttribution.arrival_index))) == [3]


def test_requests_beyond_the_per_engine_cap_go(sessions, database_url):
    with sessions() as session:
        add_engine(session, "a")
        add_engine(session, "b")
        for index in range(8):
            add_request(session, "a", index, NOW_S - 100 + index % 4)  # ties in finished_ts
        add_request(session, "b", 0, NOW_S - 1000)
        session.commit()
    pruned = retention.prune(sessions, rules(database_url, retention_requests_per_engine=3), NOW)
    assert pruned == Pruned(requests_over_cap=5, attributions=5)
    with sessions() as session:
        kept = session.execute(select(Request.engine_id, Request.arrival_index)).all()
        assert sorted(kept) == [("a", 3), ("a", 6), ("a", 7), ("b", 0)]  # newest, then by id
        assert count(sessions, Attribution) == 4


def test_the_requests_page_reads_what_is_left(client, session, settings, engine_run):
    factories.ingest(session, engine_run)
    sessions = make_sessionmaker(session.get_bind())
    path = f"/api/v1/engines/{engine_run.engine_id}/requests"
    everything = client.get(path, params={"limit": 100}).json()
    num = len(everything["requests"])
    assert num >= 4
    pruned = retention.prune(
        sessions, rules(settings.database_url, retention_requests_per_engine=2)
    )
    assert pruned.requests_over_cap == num - 2
    page = client.get(path, params={"limit": 100}).json()
    assert page["requests"] == everything["requests"][:2]  # the newest first
    assert client.get("/api/v1/junctions/suggested").status_code == 200


# ---------------------------------------------------------------------------- hit-rate buckets
def test_old_fine_buckets_roll_up_keeping_totals(sessions, database_url):
    """Buckets of 60 s over five hours: those whose hour ended over two hours ago become one
    row an hour; the others stay as they were; every counter's total is unchanged."""
    base = math.floor(NOW_S / HOUR) * HOUR - 5 * HOUR
    with sessions() as session:
        add_engine(session)
        for start in range(base, base + 5 * HOUR, 300):
            add_bucket(session, "e", start, n=start % 7 + 1)
        session.commit()
    before = bucket_rows(sessions)
    settings = rules(database_url, retention_rollup_after_s=2 * HOUR)
    pruned = retention.prune(sessions, settings, NOW)
    after = bucket_rows(sessions)
    assert totals(after) == totals(before)
    coarse = [row for row in after if row.bucket_s == HOUR]
    assert [row.bucket_start for row in coarse] == [base, base + HOUR, base + 2 * HOUR]
    assert pruned == Pruned(buckets_rolled_up=36)  # 12 a coarse hour
    young = [(r.bucket_start, r.bucket_s, totals([r])) for r in after if r.bucket_s == 60]
    assert young == [
        (r.bucket_start, 60, totals([r])) for r in before if r.bucket_start >= base + 3 * HOUR
    ]
    for row in coarse:
        inside = [r for r in before if row.bucket_start <= r.bucket_start < row.bucket_start + HOUR]
        assert totals([row]) == totals(inside)


def test_a_late_fine_bucket_is_read_folded_and_rolled_in_next_round(sessions, database_url):
    """Ingest may add a fine row inside a rolled-up hour (a request attributed late): reads
    fold it into the hour, the next round rolls it in, nothing is counted twice."""
    base = math.floor(NOW_S / HOUR) * HOUR - 5 * HOUR
    settings = rules(database_url, retention_rollup_after_s=2 * HOUR)
    with sessions() as session:
        add_engine(session)
        for start in range(base, base + HOUR, 60):
            add_bucket(session, "e", start)
        session.commit()
    retention.prune(sessions, settings, NOW)
    with sessions() as session:
        add_bucket(session, "e", base + 600, n=5)  # late, inside the rolled-up hour
        add_bucket(session, "e", base + HOUR, n=2)  # the next hour, no overlap
        session.commit()
    stored = bucket_rows(sessions)
    with sessions() as session:
        read = hit_rate.buckets(session, "e", None, None)
        assert [(r.bucket_start, r.bucket_s) for r in read] == [(base, HOUR), (base + HOUR, 60)]
        assert totals(read) == totals(stored)
        assert not session.dirty and not session.new  # the folded row is a copy, not written
        since = hit_rate.buckets(session, "e", base + 1800, base + 1900)
        assert [(r.bucket_start, r.bucket_s) for r in since] == [(base, HOUR)]
    assert retention.prune(sessions, settings, NOW) == Pruned(buckets_rolled_up=2)
    after = bucket_rows(sessions)
    assert [(r.bucket_start, r.bucket_s) for r in after] == [(base, HOUR), (base + HOUR, HOUR)]
    assert totals(after) == totals(stored)


def test_the_hit_rate_routes_serve_mixed_widths(client, session, settings):
    base = math.floor(NOW_S / HOUR) * HOUR - 5 * HOUR
    add_engine(session)
    for start in range(base, base + 4 * HOUR, 600):
        add_bucket(session, "e", start, n=2)
    session.commit()
    sessions = make_sessionmaker(session.get_bind())
    before = client.get("/api/v1/engines/e/hit-rate").json()
    attribution_before = client.get("/api/v1/engines/e/attribution").json()
    retention.prune(sessions, rules(settings.database_url, retention_rollup_after_s=2 * HOUR), NOW)
    after = client.get("/api/v1/engines/e/hit-rate").json()
    assert after["total"] == before["total"]
    assert [b["bucket_s"] for b in after["buckets"]] == [HOUR] * 3 + [60] * 6
    assert (
        client.get("/api/v1/engines/e/attribution").json()["total"] == attribution_before["total"]
    )


def test_buckets_past_their_window_go(sessions, database_url):
    with sessions() as session:
        add_engine(session)
        add_bucket(session, "e", int(NOW_S) - 1000, bucket_s=HOUR)  # ends after the cut
        add_bucket(session, "e", int(NOW_S) - 6000, bucket_s=HOUR)  # ended before it
        add_bucket(session, "e", int(NOW_S) - 2000, bucket_s=60)
        add_bucket(session, "e", int(NOW_S) - 100, bucket_s=60)
        session.commit()
    settings = rules(database_url, retention_rollup_after_s=1000, retention_buckets_s=1500)
    pruned = retention.prune(sessions, settings, NOW)
    assert pruned.buckets_expired == 2
    assert [r.bucket_start for r in bucket_rows(sessions)][-1] == int(NOW_S) - 100
    assert all(r.bucket_start + r.bucket_s > NOW_S - 1500 for r in bucket_rows(sessions))


# ---------------------------------------------------------------------------- chunks, rounds
def mixed_store(sessions: sessionmaker[Session], now: datetime = NOW, num: int = 9) -> None:
    """Something for every rule to delete (as of `now`, by `MIXED`), on two engines."""
    base = math.floor(now.timestamp() / HOUR) * HOUR - 10 * HOUR
    with sessions() as session:
        for engine_id in ("a", "b"):
            add_engine(session, engine_id, epoch=2)
            for seq in range(num):
                add_batch(session, engine_id, seq, epoch=1, now=now)
                add_batch(session, engine_id, seq, age_s=1000 if seq % 2 else 0, epoch=2, now=now)
                finished_ts = now.timestamp() - (1000 if seq % 2 else seq)
                add_request(session, engine_id, seq, finished_ts)
                add_bucket(session, engine_id, base + seq * 600)
                add_bucket(session, engine_id, base - 100 * HOUR + seq * 600)
        session.commit()


MIXED = {
    "retention_batches_s": 500,
    "retention_batches_per_engine": 3,
    "retention_requests_s": 500,
    "retention_requests_per_engine": 3,
    "retention_rollup_after_s": 2 * HOUR,
    "retention_buckets_s": 50 * HOUR,
}


def test_chunks_of_two_rows_delete_everything_over_many_transactions(sessions, database_url):
    mixed_store(sessions)
    commits = []
    event.listen(sessions.kw["bind"], "commit", lambda _connection: commits.append(1))
    once = retention.prune(sessions, rules(database_url, retention_chunk_rows=2, **MIXED), NOW)
    b_rows = bucket_rows(sessions, "b")
    whole = rules(database_url, **MIXED)
    assert retention.prune(sessions, whole, NOW) == Pruned()  # nothing was left for big chunks
    assert len(commits) >= math.ceil(once.num_rows / 2)
    assert once.batches_of_old_epochs == 18 and once.buckets_expired == 18
    assert count(sessions, EventBatch) == 2 * 3 and count(sessions, Request) == 2 * 3
    assert totals(b_rows) == {name: 9 * (i + 1) for i, name in enumerate(COUNTERS)}


def test_a_second_prune_deletes_nothing(sessions, database_url):
    mixed_store(sessions)
    settings = rules(database_url, **MIXED)
    first = retention.prune(sessions, settings, NOW)
    assert all(first) and first.num_rows > 0
    assert retention.prune(sessions, settings, NOW) == Pruned()
    assert retention.prune_round(sessions.kw["bind"], sessions, settings, NOW) == Pruned()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_one_replica_prunes_at_a_time(sessions, database_url):
    """While one replica holds the advisory lock (inside its round), another's round skips."""
    mixed_store(sessions)
    settings, db = rules(database_url, **MIXED), sessions.kw["bind"]
    other = make_engine(settings.database_url)  # the other replica: its own pool
    try:
        with retention.fleet_lock(db) as is_held:
            assert is_held
            outcome = []
            thread = threading.Thread(
                target=lambda: outcome.append(
                    retention.prune_round(other, make_sessionmaker(other), settings, NOW)
                )
            )
            thread.start()
            thread.join(60)
            assert outcome == [None]
            assert count(sessions, EventBatch) == 2 * 2 * 9  # nothing pruned
        pruned = retention.prune_round(other, make_sessionmaker(other), settings, NOW)
        assert pruned is not None and pruned.num_rows > 0
        with retention.fleet_lock(db) as is_held:  # released after the round
            assert is_held
    finally:
        other.dispose()


def run_loop_until(state: AppState, outcome: str, num: int) -> None:
    """Run the retention loop until `num` of its rounds ended with `outcome` (it must still be
    running then), cancel it, and check that the cancel ends it."""

    def rounds() -> float:
        sample = state.metrics.registry.get_sample_value(
            "junction_retention_rounds_total", {"outcome": outcome}
        )
        return sample or 0.0

    async def run() -> None:
        task = asyncio.create_task(retention.retention_loop(state))
        deadline = time.monotonic() + 60
        while rounds() < num:
            assert time.monotonic() < deadline, f"the loop did not reach {num} {outcome} rounds"
            assert not task.done(), task
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(run())
    finally:
        state.db.dispose()


def test_the_loop_prunes_every_interval_until_cancelled(sessions, database_url):
    mixed_store(sessions, utcnow())  # the loop prunes as of the clock
    settings = rules(database_url, retention_interval_s=0.01, **MIXED)
    state = AppState.from_settings(settings)
    run_loop_until(state, "pruned", 2)
    rows = state.metrics.registry.get_sample_value(
        "junction_retention_rows_total", {"kind": "event_batches"}
    )
    assert rows == 2 * (9 + 4 + 2)  # old epoch, expired, over the cap (3 kept of 5)
    assert count(sessions, EventBatch) == 2 * 3


def test_the_loop_survives_a_database_error(tmp_path):
    settings = rules(f"sqlite:///{tmp_path}/missing/dir/junction.db", retention_interval_s=0.01)
    run_loop_until(AppState.from_settings(settings), "failed", 3)


# ---------------------------------------------------------------------------- a property
def test_roll_up_sums_into_coarse_rows():
    rows = [
        {"engine_id": "e", "bucket_start": start, "bucket_s": 60} | dict.fromkeys(COUNTERS, 1)
        for start in (0, 60, 3540, 3600, 7200)
    ]
    coarse = hit_rate.roll_up(rows, HOUR)
    assert [(r["bucket_start"], r["bucket_s"], r["num_requests"]) for r in coarse] == [
        (0, HOUR, 3),
        (3600, HOUR, 1),
        (7200, HOUR, 1),
    ]


@hypothesis_settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    bucket_starts=st.sets(st.integers(0, 12 * 60), max_size=60),  # minutes back from a base
    ages=st.lists(st.floats(0, 12 * HOUR), max_size=30),
    rollup_after_h=st.integers(1, 6),
    keep_h=st.integers(0, 6),
    cap=st.integers(1, 40),
    chunk_rows=st.integers(1, 7),
)
def test_totals_in_the_kept_window_do_not_change(
    sessions, database_url, bucket_starts, ages, rollup_after_h, keep_h, cap, chunk_rows
):
    """Random fine buckets and requests: every coarse hour that ends inside the buckets'
    window totals the same after pruning; none left past the rollup point is fine; the
    requests kept are exactly the newest `cap` of those inside their window."""
    with sessions() as session:
        for model in (Attribution, Request, HitRateBucket, Engine):
            session.execute(delete(model))
        add_engine(session)
        base = math.floor(NOW_S / HOUR) * HOUR - 12 * HOUR
        for minute in bucket_starts:
            add_bucket(session, "e", base + 60 * minute, n=minute % 5 + 1)
        for index, age in enumerate(ages):
            add_request(session, "e", index, NOW_S - age)
        session.commit()
    before = bucket_rows(sessions)
    buckets_s = (rollup_after_h + keep_h) * HOUR
    settings = rules(
        database_url,
        retention_chunk_rows=chunk_rows,
        retention_rollup_after_s=rollup_after_h * HOUR,
        retention_buckets_s=buckets_s,
        retention_requests_s=6 * HOUR,
        retention_requests_per_engine=cap,
    )
    retention.prune(sessions, settings, NOW)
    after = bucket_rows(sessions)

    def by_hour(rows) -> dict[int, dict[str, int]]:
        hours: dict[int, list] = {}
        for row in rows:
            hours.setdefault(math.floor(row.bucket_start / HOUR) * HOUR, []).append(row)
        return {hour: totals(its) for hour, its in hours.items() if hour + HOUR > NOW_S - buckets_s}

    assert by_hour(after) == by_hour(before)
    rolled_until = math.floor((NOW_S - rollup_after_h * HOUR) / HOUR) * HOUR
    assert all(row.bucket_s == HOUR for row in after if row.bucket_start < rolled_until)
    assert all(row.bucket_start + row.bucket_s > NOW_S - buckets_s for row in after)
    inside = sorted(
        ((NOW_S - age, index) for index, age in enumerate(ages) if NOW_S - age >= NOW_S - 6 * HOUR),
        reverse=True,
    )
    with sessions() as session:
        kept = set(session.scalars(select(Request.arrival_index)))
        assert kept == {index for _, index in inside[:cap]}
        assert set(session.scalars(select(Attribution.arrival_index))) == kept


def test_keep_widest_keeps_a_rolled_up_width_under_a_late_upsert(sessions):
    """What ingest would write for a late request at a rolled-up hour's very start: with
    `merge=KEEP_WIDEST` the row keeps its hour, and the counters add up."""
    with sessions() as session:
        add_engine(session)
        add_bucket(session, "e", 0, bucket_s=HOUR, n=3)
        session.commit()
    late = hit_rate.bucket_row({}, "e", 10.0, 60) | {"num_requests": 1}
    with sessions() as session:
        bulk.upsert(session, hit_rate.BUCKETS, [late], COUNTERS, merge=hit_rate.KEEP_WIDEST)
        session.commit()
    [row] = bucket_rows(sessions)
    assert (row.bucket_s, row.num_requests) == (HOUR, 3 + 1)
