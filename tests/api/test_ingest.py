"""The apply functions over a real database, fed with a ledger engine's real events."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.ingest.frames import apply_batch, apply_hello, apply_snapshot
from api.store.models import Block, Engine, EventBatch, HitRateBucket, Pin, PinTarget, Request
from engine.engine import Engine as LedgerEngine
from engine.wire import CLOSE_BAD_FRAME, CLOSE_FUTURE_SEQ, CLOSE_WRONG_ENGINE, WireError
from tests.api import factories
from tests.api.factories import assert_same_table, engine_rows, parse, store_rows


def counts(session: Session) -> dict[str, int]:
    tables = {
        "batches": EventBatch,
        "blocks": Block,
        "requests": Request,
        "buckets": HitRateBucket,
        "pins": Pin,
        "pin_targets": PinTarget,
    }
    return {name: session.scalar(select(func.count()).select_from(t)) for name, t in tables.items()}


def ingest_all(session: Session, engine: LedgerEngine, events: list[dict], size: int = 16):
    """Apply every event; the store then holds the engine's table, both ways."""
    hello = parse(factories.hello(engine))
    apply_hello(session, hello)
    frames = factories.batches(engine, events, size)
    for frame in frames:
        assert not apply_batch(session, hello, parse(frame)).is_duplicate
    assert_same_table(store_rows(session, engine.engine_id), engine)
    return hello, frames


def lost_keys(events: list[dict]) -> dict[tuple[str, int], set[str]]:
    """Per block, the keys taken off it (`BlockRemoved`, the source of `BlockHashesMoved`)
    and not stored on it again since (`BlockStored`, the destination of a move)."""
    lost: dict[tuple[str, int], set[str]] = {}

    def change(group: str, block_id: int, hashes: list[str], is_lost: bool) -> None:
        keys = lost.setdefault((group, block_id), set())
        if is_lost:
            keys.update(hashes)
        else:
            keys.difference_update(hashes)

    for event in events:
        kind, hashes = event["type"], event.get("block_hashes", [])
        if kind in ("BlockRemoved", "BlockStored"):
            for block_id in event["block_ids"]:
                change(event["group"], block_id, hashes, kind == "BlockRemoved")
        elif kind == "BlockHashesMoved":
            change(event["group"], event["src_block_id"], hashes, True)
            change(event["group"], event["dst_block_id"], hashes, False)
    return lost


def test_store_table_equals_the_engines(session: Session, engine_run, events) -> None:
    _, frames = ingest_all(session, engine_run, events)
    stored = store_rows(session, engine_run.engine_id)
    assert stored, "the run changed no block"
    assert_same_table(stored, engine_run)
    # every block changed (`factories.check_reach`), so every row was reported and stored
    assert stored == engine_rows(engine_run)
    # a key evicted from a block (or moved off it) and not stored on it again is gone there
    lost = lost_keys(events)
    assert any(lost.values()), "the run evicted nothing that stayed evicted"
    for key, keys in lost.items():
        assert not keys & set(stored[key]["keys"]), (key, keys)
    engine = session.get(Engine, engine_run.engine_id)
    assert engine.next_seq == len(frames)
    assert counts(session)["batches"] == len(frames)
    stored_events = session.scalars(select(EventBatch.events).order_by(EventBatch.seq))
    assert [event["type"] for batch in stored_events for event in batch] == [
        event["type"] for event in events
    ]


def test_a_batch_seen_before_is_acknowledged_and_skipped(session: Session, engine_run, events):
    hello, frames = ingest_all(session, engine_run, events)
    before = counts(session)
    buckets = session.scalars(select(HitRateBucket.prompt_tokens)).all()
    for frame in (frames[0], frames[-1]):
        applied = apply_batch(session, hello, parse(frame))
        assert applied.is_duplicate
        assert applied.ack.seq == frame["seq"]
    assert counts(session) == before
    assert session.scalars(select(HitRateBucket.prompt_tokens)).all() == buckets
    assert session.get(Engine, engine_run.engine_id).next_seq == len(frames)
    assert_same_table(store_rows(session, engine_run.engine_id), engine_run)


def test_a_seq_from_the_future_is_refused(session: Session, engine_run, events) -> None:
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    frames = factories.batches(engine_run, events)
    apply_batch(session, hello, parse(frames[0]))
    before = counts(session)
    with pytest.raises(WireError) as error:
        apply_batch(session, hello, parse(frames[3]))
    assert error.value.code == CLOSE_FUTURE_SEQ
    assert error.value.reason == "expected seq 1, got 3"
    assert counts(session) == before
    assert session.get(Engine, engine_run.engine_id).next_seq == 1


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("engine_id", "someone-else", "batch for engine 'someone-else' on the connection of"),
        ("epoch", 7, "batch of epoch 7 on a connection of epoch"),
    ],
)
def test_a_batch_of_another_engine_is_refused(
    session: Session, engine_run, events, field: str, value, reason: str
) -> None:
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    frame = factories.batches(engine_run, events)[0] | {field: value}
    with pytest.raises(WireError) as error:
        apply_batch(session, hello, parse(frame))
    assert error.value.code == CLOSE_WRONG_ENGINE
    assert error.value.reason.startswith(reason)
    assert counts(session)["batches"] == 0


def test_a_new_epoch_clears_the_table_and_a_reconnect_resumes(
    session: Session, engine_run, events
) -> None:
    hello, frames = ingest_all(session, engine_run, events)
    again = apply_hello(session, hello)  # the same epoch: a reconnect
    assert (again.epoch, again.next_seq) == (engine_run.epoch, len(frames))
    assert counts(session)["blocks"] > 0
    restarted = parse(factories.hello(engine_run, epoch=engine_run.epoch + 1))
    welcome = apply_hello(session, restarted)
    assert (welcome.epoch, welcome.next_seq) == (engine_run.epoch + 1, 0)
    assert counts(session)["blocks"] == 0
    target = session.get(PinTarget, ("system", engine_run.engine_id))
    assert (target.state, target.reason, target.is_held) == (
        "released",
        f"engine restarted (epoch {engine_run.epoch + 1})",
        False,
    )
    assert session.get(Pin, "system").released_at is not None  # an engine's pin follows it
    # the old epoch's connection is stale now
    with pytest.raises(WireError) as error:
        apply_batch(session, hello, parse(frames[0]))
    assert error.value.code == CLOSE_WRONG_ENGINE
    assert "superseded" in error.value.reason
    # history stays: the old epoch's batches are still stored
    assert counts(session)["batches"] == len(frames)


def test_a_snapshot_stores_the_requests_it_carries_once(
    session: Session, engine_run, events
) -> None:
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    frames = factories.batches(engine_run, events, size=4)
    requests = [
        {"seq": frame["seq"], "event": event}
        for frame in frames
        for event in frame["events"]
        if event["type"] == "RequestFinished"
    ]
    num_requests = len(requests)
    assert num_requests >= 4 and len({r["seq"] for r in requests}) >= 3
    # the store committed the batches up to the second request's, and the engine, not knowing
    # (its ack was lost), replaced every batch with a snapshot carrying all their requests
    committed = requests[1]["seq"]
    for frame in frames[: committed + 1]:
        apply_batch(session, hello, parse(frame))
    assert counts(session)["requests"] == 2
    snapshot = factories.snapshot(engine_run, seq=len(frames)) | {"requests": requests}
    applied = apply_snapshot(session, hello, parse(snapshot))
    assert not applied.is_duplicate
    assert counts(session)["requests"] == num_requests  # none lost, none twice
    stored = session.scalars(select(Request.request_id).order_by(Request.request_id)).all()
    expected = sorted(r["event"]["request_id"] for r in requests)
    assert stored == expected
    # the hit-rate buckets count every request once too
    buckets = session.scalars(select(HitRateBucket)).all()
    assert sum(b.num_requests for b in buckets) == num_requests
    # a duplicate of the snapshot adds nothing
    assert apply_snapshot(session, hello, parse(snapshot)).is_duplicate
    assert counts(session)["requests"] == num_requests
    assert_same_table(store_rows(session, engine_run.engine_id), engine_run)


def test_carried_requests_at_the_next_seq_boundary(session: Session, engine_run, events) -> None:
    """A carried request of the batch just before `next_seq` was committed with that batch
    (skipped); one of the batch at `next_seq` was not (stored): off by one either way, a
    request is lost or stored twice."""
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    # one batch per request: each ends with its RequestFinished
    ends = [i + 1 for i, event in enumerate(events) if event["type"] == "RequestFinished"]
    frames = [
        factories.batches(engine_run, events[start:end], size=len(events), first_seq=seq)[0]
        for seq, (start, end) in enumerate(zip([0, *ends], ends, strict=False))
    ]
    boundary = len(frames) // 2
    for frame in frames[:boundary]:
        apply_batch(session, hello, parse(frame))
    assert session.get(Engine, engine_run.engine_id).next_seq == boundary
    before = counts(session)["requests"]
    carried = [
        {"seq": frame["seq"], "event": event}
        for frame in frames[boundary - 1 : boundary + 1]
        for event in frame["events"]
        if event["type"] == "RequestFinished"
    ]
    assert [r["seq"] for r in carried] == [boundary - 1, boundary]
    snapshot = factories.snapshot(engine_run, seq=boundary) | {"requests": carried}
    apply_snapshot(session, hello, parse(snapshot))
    assert counts(session)["requests"] == before + 1  # the one at next_seq, once
    stored = set(session.scalars(select(Request.request_id)).all())
    assert {r["event"]["request_id"] for r in carried} <= stored


def test_a_snapshot_replaces_the_table(session: Session, engine_run, events) -> None:
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    frames = factories.batches(engine_run, events)
    for frame in frames[:3]:  # the store saw the start, then the engine lost its buffer
        apply_batch(session, hello, parse(frame))
    snapshot = factories.snapshot(engine_run, seq=len(frames) + 5)
    applied = apply_snapshot(session, hello, parse(snapshot))
    assert (applied.ack.seq, applied.is_duplicate) == (len(frames) + 5, False)
    assert store_rows(session, engine_run.engine_id) == engine_rows(engine_run)  # every row
    assert session.get(Engine, engine_run.engine_id).next_seq == len(frames) + 6
    target = session.get(PinTarget, ("system", engine_run.engine_id))
    assert (target.state, target.is_held) == ("materialized", True)
    assert session.get(Pin, "system").origin == "engine"
    # an older snapshot is acknowledged and dropped
    stale = factories.snapshot(engine_run, seq=2) | {"blocks": [], "pins": []}
    assert apply_snapshot(session, hello, parse(stale)).is_duplicate
    assert store_rows(session, engine_run.engine_id) == engine_rows(engine_run)
    # a newer one without the pin releases it
    empty = factories.snapshot(engine_run, seq=len(frames) + 6) | {"blocks": [], "pins": []}
    apply_snapshot(session, hello, parse(empty))
    session.expire_all()
    assert store_rows(session, engine_run.engine_id) == {}
    target = session.get(PinTarget, ("system", engine_run.engine_id))
    assert (target.state, target.reason) == ("released", f"not in snapshot {len(frames) + 6}")


def test_finished_requests_become_rows_and_buckets(session: Session, engine_run, events) -> None:
    ingest_all(session, engine_run, events)
    finished = [e for e in events if e["type"] == "RequestFinished"]
    assert len(finished) == engine_run.stats.num_requests > 0
    rows = {r.request_id: r for r in session.scalars(select(Request))}
    assert set(rows) == {e["request_id"] for e in finished}
    for event in finished:
        row = rows[event["request_id"]]
        for name, value in event.items():
            if name not in ("type", "unit_hashes"):  # the raw hashes are never stored
                expected = [list(c) for c in value] if name == "chunks" else value
                assert getattr(row, name) == expected, name
        assert (row.engine_id, row.epoch) == (engine_run.engine_id, engine_run.epoch)
    buckets = {b.bucket_start: b for b in session.scalars(select(HitRateBucket))}
    expected: dict[int, list[dict]] = {}
    for event in finished:
        expected.setdefault(math.floor(event["finished_ts"] / 60) * 60, []).append(event)
    assert set(buckets) == set(expected)
    for start, group in expected.items():
        bucket = buckets[start]
        assert bucket.bucket_s == 60
        assert bucket.num_requests == len(group)
        assert bucket.prompt_tokens == sum(e["num_prompt_tokens"] for e in group)
        assert bucket.cached_tokens == sum(e["num_cached_tokens"] for e in group)
        assert bucket.computed_tokens == sum(e["num_computed_tokens"] for e in group)
        hits = [e["hit_tokens_by_group"] for e in group]
        assert bucket.attention_hit_tokens == sum(h["attention"] for h in hits)
        assert bucket.mamba_hit_tokens == sum(h["mamba"] for h in hits)
    assert sum(b.cached_tokens for b in buckets.values()) > 0, "the run had no cache hit"


def test_buckets_add_up_across_batches(session: Session, engine_run, events) -> None:
    """Two batches whose requests finish in the same bucket increment one row."""
    finished = [e for e in events if e["type"] == "RequestFinished"][:2]
    same_time = [e | {"finished_ts": 1_700_000_010.5} for e in finished]
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    for frame in factories.batches(engine_run, same_time, size=1):
        apply_batch(session, hello, parse(frame), bucket_s=60)
    (bucket,) = session.scalars(select(HitRateBucket)).all()
    assert bucket.bucket_start == 1_700_000_010 // 60 * 60
    assert bucket.num_requests == 2
    assert bucket.prompt_tokens == sum(e["num_prompt_tokens"] for e in finished)


def test_an_engines_pin_is_recorded_as_made_elsewhere(session: Session, engine_run, events) -> None:
    ingest_all(session, engine_run, events)
    updates = [e for e in events if e["type"] == "PinUpdated"]
    assert [u["state"] for u in updates] == ["pending", "materialized"]
    last = updates[-1]
    pin = session.get(Pin, "system")
    assert (pin.origin, pin.label, pin.token_ids, pin.num_tokens, pin.target_mode) == (
        "engine",
        "system",
        None,
        last["num_tokens"],
        "list",
    )
    assert pin.released_at is None
    target = session.get(PinTarget, ("system", engine_run.engine_id))
    assert (target.state, target.boundary, target.is_held) == (
        "materialized",
        last["boundary"],
        True,
    )
    assert (target.keys, target.block_ids) == (last["keys"], last["block_ids"])


def test_a_value_the_store_cannot_hold_rolls_the_batch_back(
    session: Session, engine_run, events
) -> None:
    hello = parse(factories.hello(engine_run))
    apply_hello(session, hello)
    # finite, so it passes the edge (which refuses an integer beyond 64 bits), but its
    # hit-rate bucket starts beyond what a 64-bit column holds
    finished = next(e for e in events if e["type"] == "RequestFinished")
    frame = factories.batches(engine_run, events[:40] + [finished | {"finished_ts": 1e300}], 100)[0]
    with pytest.raises(WireError) as error:
        apply_batch(session, hello, parse(frame))
    assert error.value.code == CLOSE_BAD_FRAME
    assert error.value.reason.startswith("the store cannot hold a value")
    assert set(counts(session).values()) == {0}
    assert session.get(Engine, engine_run.engine_id).next_seq == 0
