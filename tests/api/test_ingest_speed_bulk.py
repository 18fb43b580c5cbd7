"""What the faster ingest path relies on, on each backend: `bulk.upsert(..., returning=)` hands
back the rows as stored (PostgreSQL) or nothing (SQLite, whose caller reads them), so
`shared_units.upsert` gives the records a read after it would; and bulk rows written as one
JSON array keep `bytes` and aware datetimes exactly."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import bulk, shared_units
from api.models import AttributionSalt, Engine


def _engine(session: Session, engine_id: str = "e") -> None:
    now = datetime.now(UTC)
    session.add(Engine(engine_id=engine_id, epoch=1, next_seq=0, first_seen=now, last_seen=now))
    session.flush()


def test_upserted_units_come_back_as_a_read_finds_them(session: Session) -> None:
    _engine(session)
    shared_units.upsert(session, "e", {1: [1, 5, 10.0, 10.0], 2: [1, 6, 11.0, 11.0]})
    # a later arrival, an earlier finish, an earlier epoch: each field merges its own way
    batch = {1: [1, 9, 8.0, 12.0], 2: [0, 7, 20.0, 20.0], 3: [1, 9, 12.0, 12.0]}
    written = shared_units.upsert(session, "e", batch)
    read = shared_units.records(session, "e", {1, 2, 3})
    assert read == {
        1: shared_units.Record(1, 5, 8.0),
        2: shared_units.Record(0, 7, 11.0),
        3: shared_units.Record(1, 9, 12.0),
    }
    assert written == (read if bulk.can_return(session) else {})


def test_bytes_and_datetimes_survive_the_json_rows(session: Session) -> None:
    salt = bytes(range(32))
    bulk.insert_missing(session, AttributionSalt.__table__, [{"id": 1, "salt": salt}])
    assert session.scalar(select(AttributionSalt.salt)) == salt
    seen = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    row = {"engine_id": "e2", "epoch": 3, "next_seq": 0, "geometry": {"unit": 16}, "model": {}}
    row |= {"connected": False, "first_seen": seen, "last_seen": seen, "last_drop": None}
    row |= {"num_batches_dropped": 0, "num_requests_dropped": 0, "num_peer_blocks": 0}
    row |= {"replica_id": None, "connection_id": None}
    bulk.insert_missing(session, Engine.__table__, [row])
    stored = session.get(Engine, "e2")
    assert stored is not None
    assert (stored.first_seen, stored.last_seen, stored.geometry) == (seen, seen, {"unit": 16})
