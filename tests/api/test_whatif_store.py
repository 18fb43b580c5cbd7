"""What-if recordings in the store, on both backends, fed a real ledger engine's events: each
finished request's salted chain lands (from batches and from a snapshot's carried requests),
the pins' too; requests without unit hashes are not kept; the chains are pruned at the cap
and past the window; `load_recording` reads them back in arrival order; no route serves them.
"""

from __future__ import annotations

import msgspec
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.attribution import request_chains as chains
from api.attribution import unit_salt
from api.attribution.record import AttributionConfig
from api.ingest.frames import apply_batch, apply_hello, apply_snapshot
from api.store.models import RequestChain
from api.whatif.recording import NoRecording, load_recording
from engine.engine import Engine
from tests.api import factories


def finished_events(engine: Engine) -> list:
    return [e for e in engine.sink.events if e.type == "RequestFinished"]


def stored(session: Session) -> dict[int, RequestChain]:
    query = select(RequestChain).execution_options(populate_existing=True)
    return {row.arrival_index: row for row in session.scalars(query)}


def test_every_finished_request_and_pin_keeps_its_salted_chain(session, engine_run):
    factories.ingest(session, engine_run)
    rows = stored(session)
    salt = unit_salt.store_salt(session)
    finished = finished_events(engine_run)
    events = engine_run.sink.events
    (pin,) = [e for e in events if e.type == "PinUpdated" and e.state == "materialized"]
    assert set(rows) == {e.arrival_index for e in finished} | {pin.arrival_index}
    for event in finished:
        row = rows[event.arrival_index]
        assert not row.pin and row.epoch == engine_run.epoch
        assert unit_salt.unpack(row.units) == unit_salt.salted_chain(event.unit_hashes, salt)
        assert (row.num_prompt_tokens, row.num_output_tokens, row.num_cached_tokens) == (
            event.num_prompt_tokens,
            event.num_output_tokens,
            event.num_cached_tokens,
        )
        assert (row.arrival_step, row.checkpoint_offsets) == (
            event.arrival_step,
            list(event.checkpoint_offsets),
        )
        assert row.finished_ts == event.finished_ts
    pinned = rows[pin.arrival_index]
    assert pinned.pin and pinned.num_prompt_tokens == pin.boundary
    assert unit_salt.unpack(pinned.units) == unit_salt.salted_chain(pin.unit_hashes, salt)
    # a unit is salted as miss attribution salts it: the chains' units are the shared ones
    from api.store.models import SharedUnit

    shared = set(session.scalars(select(SharedUnit.hash)))
    assert {u for row in rows.values() for u in unit_salt.unpack(row.units)} == shared


def test_load_recording_replays_the_epoch_in_arrival_order(session, engine_run):
    factories.ingest(session, engine_run)
    recording = load_recording(session, engine_run.engine_id)
    geometry = engine_run.cache_geometry()
    assert recording.geometry == geometry and recording.unit == geometry.prefix_match_unit
    indexes = [r.arrival_index for r in recording.requests]
    assert indexes == sorted(indexes) and recording.requests[0].pin
    assert [r.id for r in recording.requests] == [str(i) for i in indexes]
    finished = finished_events(engine_run)
    assert recording.num_requests == len(finished)
    assert recording.num_cached_tokens == sum(e.num_cached_tokens for e in finished)
    for request in recording.requests[1:]:
        # a chain holds a unit every U tokens of prompt and output
        length = request.num_prompt_tokens + request.num_output_tokens
        assert len(request.units) == length // recording.unit
    newest = load_recording(session, engine_run.engine_id, limit=3)
    assert [r.arrival_index for r in newest.requests] == [indexes[0], *indexes[-3:]]
    with pytest.raises(NoRecording, match="no recorded request chains in epoch 7"):
        load_recording(session, engine_run.engine_id, epoch=7)
    with pytest.raises(NoRecording, match="'ghost' not found"):
        load_recording(session, "ghost")


def test_a_snapshot_keeps_the_chains_of_the_requests_it_carries(session, engine_run):
    hello = factories.parse(factories.hello(engine_run))
    apply_hello(session, hello)
    frame = factories.snapshot(engine_run, seq=0)
    frame["requests"] = [{"seq": 0, "event": e.to_dict()} for e in finished_events(engine_run)]
    wide = AttributionConfig(window_s=1e12)  # the frame's ts is years after the run's
    apply_snapshot(session, hello, factories.parse(frame), config=wide)
    rows = stored(session)
    assert {i for i, row in rows.items() if not row.pin} == {
        e.arrival_index for e in finished_events(engine_run)
    }
    assert sum(row.pin for row in rows.values()) == 1
    again = dict(frame, seq=1)  # the pins come again with every snapshot: kept once
    apply_snapshot(session, hello, factories.parse(again), config=wide)
    assert len(stored(session)) == len(rows)


def test_a_pin_prefill_is_kept_once_queued_held_or_not(session, engine_run):
    """Its pending report (once queued) keeps its chain; attribution waits for it to hold."""
    from api.store.models import SharedUnit

    hello = factories.parse(factories.hello(engine_run))
    apply_hello(session, hello)
    (pending,) = [
        e.to_dict()
        for e in engine_run.sink.events
        if e.type == "PinUpdated" and e.state == "pending"
    ]
    apply_batch(session, hello, factories.parse(factories.batches(engine_run, [pending])[0]))
    (row,) = stored(session).values()
    assert row.pin and row.arrival_index == pending["arrival_index"]
    assert row.num_prompt_tokens == pending["boundary"]
    assert session.scalar(select(func.count()).select_from(SharedUnit)) == 0


def test_requests_of_an_engine_that_reports_no_chain_are_not_kept(session, engine_run):
    hello = factories.parse(factories.hello(engine_run))
    apply_hello(session, hello)
    events = [
        msgspec.structs.replace(e, unit_hashes="", match_stop=None).to_dict()
        for e in engine_run.sink.events
        if e.type == "RequestFinished"
    ]
    frame = factories.batches(engine_run, events, size=100)[0]
    apply_batch(session, hello, factories.parse(frame))
    assert stored(session) == {}
    with pytest.raises(NoRecording, match="no recorded request chains"):
        load_recording(session, engine_run.engine_id)


def test_chains_past_the_cap_or_the_window_are_pruned_oldest_first(session, engine_run):
    factories.ingest(session, engine_run)
    rows = stored(session)
    by_finish = sorted(rows.values(), key=lambda r: (r.finished_ts, r.epoch, r.arrival_index))
    newest = by_finish[-1].finished_ts
    engine_id = engine_run.engine_id
    assert chains.prune(session, engine_id, newest, 1e9, 10**6) == 0
    assert chains.prune(session, engine_id, newest, 1e9, 4) == len(rows) - 4
    assert set(stored(session)) == {r.arrival_index for r in by_finish[-4:]}
    kept = stored(session)
    cutoff = sorted(r.finished_ts for r in kept.values())[2]
    gone = chains.prune(session, engine_id, cutoff + 5, 5, 10**6)
    assert gone == sum(r.finished_ts < cutoff for r in kept.values())
    assert all(r.finished_ts >= cutoff for r in stored(session).values())


def test_ingest_prunes_the_chains_at_the_setting_s_cap(session, engine_run):
    hello = factories.parse(factories.hello(engine_run))
    apply_hello(session, hello)
    config = AttributionConfig(window_s=1e12, max_requests=3)
    frame = factories.snapshot(engine_run, seq=0)
    frame["requests"] = [{"seq": 0, "event": e.to_dict()} for e in finished_events(engine_run)]
    apply_snapshot(session, hello, factories.parse(frame), config=config)  # checks the caps
    count = session.scalar(select(func.count()).select_from(RequestChain))
    assert count == 3


def test_no_route_serves_a_chain(client: TestClient, session, engine_run):
    factories.ingest(session, engine_run)
    units = {u for row in stored(session).values() for u in unit_salt.unpack(row.units)}
    packed = [row.units.hex() for row in stored(session).values()]
    paths = [
        path.format(engine_id=engine_run.engine_id, run_id=1, request_id="req-0", pin_id="system")
        for path, operations in client.app.openapi()["paths"].items()
        if "get" in operations and path.startswith("/api/v1")
    ]
    texts = []
    for path in paths:
        response = client.get(path, params={"limit": 1000})
        texts.append(response.text)
    served = "\n".join(texts)
    assert engine_run.engine_id in served  # the routes did find the engine
    assert not [u for u in units if str(u) in served or f"{u & (2**64 - 1):016x}" in served]
    assert not [chain for chain in packed if chain[:32] in served]


def test_a_restart_s_pin_alone_does_not_hide_the_epoch_that_ran(session, engine_run):
    factories.ingest(session, engine_run)
    later = engine_run.epoch + 1
    hello = factories.parse(factories.hello(engine_run, epoch=later))
    apply_hello(session, hello)
    (pending,) = [
        e.to_dict()
        for e in engine_run.sink.events
        if e.type == "PinUpdated" and e.state == "pending"
    ]
    apply_batch(
        session, hello, factories.parse(factories.batches(engine_run, [pending], epoch=later)[0])
    )
    assert {row.epoch for row in stored(session).values()} == {engine_run.epoch, later}
    assert load_recording(session, engine_run.engine_id).num_requests == 8
    with pytest.raises(NoRecording, match=f"in epoch {later}"):
        load_recording(session, engine_run.engine_id, epoch=later)
