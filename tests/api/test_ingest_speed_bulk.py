"""What the faster ingest path relies on, on each backend: `bulk.upsert(..., returning=)` hands
back the rows as stored (PostgreSQL) or nothing (SQLite, whose caller reads them), so
`shared_units.upsert` gives the records a read after it would; bulk rows written as one
JSON array keep `bytes` and aware datetimes exactly; the next batches of a stream claim their
seqs in one statement on the engine's row, while a resend or a gap takes the locked read;
PostgreSQL plans each statement for its own parameters."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.orm import Session

from api.attribution import shared_units
from api.ingest.frames import apply_batches, apply_hello
from api.store import bulk
from api.store.models import AttributionSalt, Engine
from engine.geometry import CacheGeometry
from engine.wire import CLOSE_FUTURE_SEQ, WireError
from tests.api import factories
from tests.api.factories import assert_same_table, parse, store_rows


def _engine(session: Session, engine_id: str = "e") -> None:
    now = datetime.now(UTC)
    session.add(Engine(engine_id=engine_id, epoch=1, next_seq=0, first_seen=now, last_seen=now))
    session.flush()


def test_upserted_units_come_back_as_a_read_finds_them(session: Session) -> None:
    _engine(session)
    shared_units.upsert(
        session, "e", {1: [1, 5, 10.0, 10.0, 1, 10.0], 2: [1, 6, 11.0, 11.0, 1, 11.0]}
    )
    # a later arrival, an earlier finish, an earlier epoch, a later one: each field merges its
    # own way (a later epoch starts its finish afresh, an earlier one leaves it)
    batch = {
        1: [1, 9, 8.0, 12.0, 1, 8.0],
        2: [0, 7, 20.0, 20.0, 0, 20.0],
        3: [1, 9, 12.0, 12.0, 1, 12.0],
    }
    shared_units.upsert(session, "e", batch)
    written = shared_units.upsert(session, "e", {3: [2, 0, 30.0, 30.0, 2, 30.0]})
    read = shared_units.records(session, "e", {1, 2, 3})
    assert read == {
        1: shared_units.Record(1, 5, 8.0, 1, 8.0),
        2: shared_units.Record(0, 7, 11.0, 1, 11.0),
        3: shared_units.Record(1, 9, 12.0, 2, 30.0),
    }
    assert written == ({3: read[3]} if bulk.can_return(session) else {})


def test_bytes_and_datetimes_survive_the_json_rows(session: Session) -> None:
    salt = bytes(range(32))
    bulk.insert_missing(session, AttributionSalt.__table__, [{"id": 1, "salt": salt}])
    assert session.scalar(select(AttributionSalt.salt)) == salt
    seen = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    geometry = {"prefix_match_unit": 16, "unit": 16}  # a key the struct does not know: ignored
    row = {"engine_id": "e2", "epoch": 3, "next_seq": 0, "geometry": geometry, "model": {}}
    row |= {"connected": False, "first_seen": seen, "last_seen": seen, "last_drop": None}
    row |= {"num_batches_dropped": 0, "num_requests_dropped": 0, "num_peer_blocks": 0}
    row |= {"replica_id": None, "connection_id": None}
    bulk.insert_missing(session, Engine.__table__, [row])
    stored = session.get(Engine, "e2")
    assert stored is not None
    expected = CacheGeometry(prefix_match_unit=16)
    assert (stored.first_seen, stored.last_seen, stored.geometry) == (seen, seen, expected)


def _engine_statements(session: Session) -> list[str]:
    """The statements on the `engines` table the session runs from now on (first words)."""
    seen: list[str] = []

    def record(_conn, _cursor, statement: str, *_) -> None:
        if "engines" in statement.split("WHERE")[0]:
            seen.append(" ".join(statement.split()[:2]))

    event.listen(session.get_bind(), "before_cursor_execute", record)
    return seen


def test_the_next_batches_claim_their_seqs_in_one_statement(session: Session) -> None:
    ledger = factories.run_engine()
    hello = parse(factories.hello(ledger))
    apply_hello(session, hello)
    frames = [parse(f) for f in factories.batches(ledger, factories.event_dicts(ledger), 8)]
    assert len(frames) >= 6
    seen = _engine_statements(session)
    applied = apply_batches(session, hello, frames[:3])
    assert [a.is_duplicate for a in applied] == [False] * 3
    assert seen == ["UPDATE engines"]  # no read of the row: the claim locked and moved it
    # a resend of the last two with the next one: the claim fails, the locked read decides
    seen.clear()
    applied = apply_batches(session, hello, frames[1:4])
    assert [a.is_duplicate for a in applied] == [True, True, False]
    assert seen == ["UPDATE engines", "SELECT engines.epoch,", "UPDATE engines"]
    with pytest.raises(WireError) as gap:  # a gap: refused, nothing written
        apply_batches(session, hello, frames[5:])
    assert gap.value.code == CLOSE_FUTURE_SEQ
    assert session.get(Engine, ledger.engine_id, populate_existing=True).next_seq == 4
    apply_batches(session, hello, frames[4:])
    assert_same_table(store_rows(session, ledger.engine_id), ledger)


def test_postgresql_plans_each_statement_for_its_own_parameters(session: Session) -> None:
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("plan_cache_mode is PostgreSQL's")
    # the generic plan of shared_units.prune scanned every unit of the engine (api.store.db)
    assert session.scalar(text("SHOW plan_cache_mode")) == "force_custom_plan"
