"""`shared_units`: the match units each engine's finished sequences held, salted
(`api.attribution.unit_salt`), each with the earliest arrival that held it, the earliest finish of
one, the latest sighting, and the latest epoch that held it with the earliest finish in that
epoch (an engine restart empties its cache: a unit held only in an earlier epoch was lost to the
restart, not evicted); bounded by a retention window and a per-engine cap. Nothing here
commits: the caller's transaction does.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Table, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from api.store import bulk
from api.store.models import SharedUnit
from workloads.attribute import Record

UNITS: Table = SharedUnit.__table__
PRUNE_BATCH = 5000  # units deleted per prune statement: short locks, the next batch goes on
# the window and the per-engine cap are pruned on every 64th seq (a count is a scan; a prune
# every frame was a statement each frame), PRUNE_BATCH a time: ahead of what 64 frames add
CAP_CHECK_EVERY = 64
SQLITE_IN_CHUNK = 10_000  # SQLite's bound parameters per statement (32766) leave room
# a unit's record keeps its earliest arrival, earliest finish and latest sighting, and its
# latest epoch with the earliest finish in it (a later epoch starts that finish afresh)
LATER = "{new}.last_epoch > {old}.last_epoch"
MERGE = {
    "first_epoch": "CASE WHEN {new}.first_epoch < {old}.first_epoch "
    "THEN {new}.first_epoch ELSE {old}.first_epoch END",
    "first_index": "CASE WHEN ({new}.first_epoch, {new}.first_index) < "
    "({old}.first_epoch, {old}.first_index) THEN {new}.first_index ELSE {old}.first_index END",
    "first_finished_ts": "CASE WHEN {new}.first_finished_ts < {old}.first_finished_ts "
    "THEN {new}.first_finished_ts ELSE {old}.first_finished_ts END",
    "last_seen_ts": "CASE WHEN {new}.last_seen_ts > {old}.last_seen_ts "
    "THEN {new}.last_seen_ts ELSE {old}.last_seen_ts END",
    "last_epoch": f"CASE WHEN {LATER} THEN {{new}}.last_epoch ELSE {{old}}.last_epoch END",
    "last_epoch_finished_ts": f"CASE WHEN {LATER} THEN {{new}}.last_epoch_finished_ts "
    "WHEN {new}.last_epoch < {old}.last_epoch THEN {old}.last_epoch_finished_ts "
    "WHEN {new}.last_epoch_finished_ts < {old}.last_epoch_finished_ts "
    "THEN {new}.last_epoch_finished_ts ELSE {old}.last_epoch_finished_ts END",
}


RETURNED = ("hash", *Record._fields)  # what `upsert` hands back of each unit


def merge(units: dict[int, list], chain: list[int], epoch: int, index: int, ts: float) -> None:
    """Fold one sequence's chain into the batch's records (`[first_epoch, first_index,
    first_finished_ts, last_seen_ts, last_epoch, last_epoch_finished_ts]`), as `MERGE` folds
    them into the stored ones."""
    for unit in chain:
        seen = units.get(unit)
        if seen is None:
            units[unit] = [epoch, index, ts, ts, epoch, ts]
            continue
        if (epoch, index) < (seen[0], seen[1]):
            seen[0], seen[1] = epoch, index
        seen[2], seen[3] = min(seen[2], ts), max(seen[3], ts)
        if epoch > seen[4]:
            seen[4], seen[5] = epoch, ts
        elif epoch == seen[4]:
            seen[5] = min(seen[5], ts)


def upsert(session: Session, engine_id: str, units: dict[int, list]) -> dict[int, Record]:
    """Fold the batch's records (`merge`'s) into the engine's stored ones (one statement);
    returns the records of `units` as stored now where the database hands them back
    (PostgreSQL: `RETURNING`, no read after), else nothing (`records` reads them)."""
    written = bulk.upsert(
        session,
        UNITS,
        [
            {"engine_id": engine_id, "hash": h, "first_epoch": e, "first_index": i}
            | {"first_finished_ts": f, "last_seen_ts": s}
            | {"last_epoch": le, "last_epoch_finished_ts": lf}
            for h, (e, i, f, s, le, lf) in units.items()
        ],
        merge=MERGE,
        returning=RETURNED,
    )
    return {h: Record(*fields) for h, *fields in written}


def records(session: Session, engine_id: str, units: set[int]) -> dict[int, Record]:
    """The stored records of `units` (one statement on PostgreSQL, an array parameter)."""
    columns = (SharedUnit.hash, *(getattr(SharedUnit, name) for name in Record._fields))
    where = SharedUnit.engine_id == engine_id
    if not units:
        return {}
    if session.get_bind().dialect.name == "postgresql":
        param = bindparam("units", list(units), type_=ARRAY(BigInteger()))
        rows = session.execute(select(*columns).where(where, SharedUnit.hash == func.any(param)))
        return {h: Record(*fields) for h, *fields in rows}
    found: dict[int, Record] = {}
    listed = list(units)
    for start in range(0, len(listed), SQLITE_IN_CHUNK):
        chunk = listed[start : start + SQLITE_IN_CHUNK]
        rows = session.execute(select(*columns).where(where, SharedUnit.hash.in_(chunk)))
        found.update((h, Record(*fields)) for h, *fields in rows)
    return found


def prune(
    session: Session,
    engine_id: str,
    now_ts: float,
    window_s: float,
    max_units: int,
    check_cap: bool = False,
) -> int:
    """Delete up to `PRUNE_BATCH` of the engine's units last seen over `window_s` before
    `now_ts`, and (`check_cap`) up to as many of its least recently seen beyond `max_units`;
    returns how many went. Later calls take the rest, so no call holds a long lock."""
    mine = SharedUnit.engine_id == engine_id
    stale = (
        select(SharedUnit.hash)
        .where(mine, SharedUnit.last_seen_ts < now_ts - window_s)
        .limit(PRUNE_BATCH)
    )
    removed = session.execute(delete(SharedUnit).where(mine, SharedUnit.hash.in_(stale))).rowcount
    if check_cap:
        count = session.scalar(select(func.count()).select_from(SharedUnit).where(mine)) or 0
        excess = min(count - max_units, PRUNE_BATCH)
        if excess > 0:
            oldest = (
                select(SharedUnit.hash)
                .where(mine)
                .order_by(SharedUnit.last_seen_ts, SharedUnit.hash)
                .limit(excess)
            )
            query = delete(SharedUnit).where(mine, SharedUnit.hash.in_(oldest))
            removed += session.execute(query).rowcount
    return removed
