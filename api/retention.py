"""Retention: what keeps the store's size bounded while engines stream into it for months.

`prune` applies the `JUNCTION_RETENTION_*` rules once; `retention_loop` runs it every
`JUNCTION_RETENTION_INTERVAL_S`, on one replica at a time. The rules, by table:

- `event_batches`: a batch goes once its epoch is older than its engine's (the newer epoch's
  hello replaced the table it built), once it was received more than `retention_batches_s`
  ago, and once its engine has `retention_batches_per_engine` newer ones. Readers of
  `/events` then start at the oldest batch kept (their `after_seq` may fall in a gap), and
  the block grid's links look back over what is left; nothing else reads batches.
- `requests`: a request goes once it finished (`finished_ts`) more than `retention_requests_s`
  ago, and once its engine has `retention_requests_per_engine` that finished after it. Its
  attribution row, or its pending one (with its salted unit chain), goes with it: they are
  keyed by its (engine, epoch, arrival index) and describe nothing else. The hit-rate buckets
  it counted in keep its totals.
- `hit_rate_buckets`: a bucket finer than `retention_rollup_bucket_s` whose coarse bucket
  ended more than `retention_rollup_after_s` ago is rolled into it (`hit_rate.roll_up`:
  every counter summed, the totals unchanged); a bucket that ended more than
  `retention_buckets_s` ago goes.

No statement holds a lock for long: each rule deletes at most `retention_chunk_rows` rows a
transaction (`DELETE ... WHERE id IN (SELECT id ... LIMIT n)`, on an index), commits, and goes
on until a chunk comes back short, so ingest's transactions wait for one chunk at most. A
rolled-up chunk is deleted with `RETURNING` and its sums upserted in the same transaction,
so a concurrent ingest's increment lands either before (and is summed) or after (in a new fine
row, rolled up next round), never lost. On PostgreSQL a round runs only while it holds a
session-level advisory lock (`fleet_lock`), so of several replicas one prunes at a time; on a
server whose autovacuum is off the round ends with a VACUUM of the store's tables, so the space
of what it deleted (and of what ingest updates in place) is reused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Engine as Database
from sqlalchemy import Table, and_, delete, or_, select, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from api.attribution import hit_rate
from api.attribution.hit_rate import BUCKETS, COUNTERS
from api.settings import Settings
from api.store import bulk
from api.store.models import (
    Attribution,
    Base,
    Engine,
    EventBatch,
    HitRateBucket,
    PendingAttribution,
    Request,
    utcnow,
)

if TYPE_CHECKING:
    from api.state import AppState

log = logging.getLogger(__name__)

#: The advisory lock of the retention task, fleet-wide ("junction" in ASCII)
LOCK_KEY = 0x6A756E6374696F6E
KEYS_PER_STATEMENT = 1000  # arrival indexes in one `IN` list (SQLite binds at most 32,766)


class Pruned(NamedTuple):
    """What one `prune` deleted (or, for rolled-up buckets, merged), by rule."""

    batches_of_old_epochs: int = 0  # of an epoch older than their engine's
    batches_expired: int = 0  # received more than `retention_batches_s` ago
    batches_over_cap: int = 0  # beyond the newest `retention_batches_per_engine` of an engine
    requests_expired: int = 0  # finished more than `retention_requests_s` ago
    requests_over_cap: int = 0  # beyond the newest `retention_requests_per_engine`
    attributions: int = 0  # attribution and pending rows of the deleted requests
    buckets_rolled_up: int = 0  # fine buckets merged into coarse ones (the coarse ones stay)
    buckets_expired: int = 0  # ended more than `retention_buckets_s` ago

    @property
    def num_rows(self) -> int:
        """Rows gone from the store (a rolled-up bucket is gone, its sums live on)."""
        return sum(self)

    def by_kind(self) -> dict[str, int]:
        """The counts the metrics keep: `junction_retention_rows{kind=...}`."""
        return {
            "event_batches": self.batches_of_old_epochs
            + self.batches_expired
            + self.batches_over_cap,
            "requests": self.requests_expired + self.requests_over_cap,
            "attributions": self.attributions,
            "buckets_rolled_up": self.buckets_rolled_up,
            "buckets_expired": self.buckets_expired,
        }


def prune(
    sessions: sessionmaker[Session],
    settings: Settings,
    now: datetime | None = None,
    stop: threading.Event | None = None,
) -> Pruned:
    """Apply every retention rule once, as of `now` (default: the clock), in transactions of
    at most `retention_chunk_rows` rows each; `stop` set ends it after the chunk in flight.
    A second call at the same `now` deletes nothing."""
    now = now or utcnow()
    now_s = now.timestamp()
    chunks = _Chunks(sessions, settings.retention_chunk_rows, stop or threading.Event())
    with sessions() as session:
        engines = session.execute(select(Engine.engine_id, Engine.epoch)).all()
    counts = defaultdict(int)
    batches: Table = EventBatch.__table__
    for engine_id, epoch in engines:
        of_engine = batches.c.engine_id == engine_id
        counts["batches_of_old_epochs"] += chunks.delete_ids(
            batches, of_engine, batches.c.epoch < epoch
        )
    received = now - timedelta(seconds=settings.retention_batches_s)
    counts["batches_expired"] += chunks.delete_ids(batches, batches.c.received_at < received)
    finished_s = now_s - settings.retention_requests_s
    expired_s = now_s - settings.retention_buckets_s
    rollup_s = now_s - settings.retention_rollup_after_s
    for engine_id, epoch in engines:
        counts["batches_over_cap"] += _batches_over_cap(
            chunks, engine_id, epoch, settings.retention_batches_per_engine
        )
        expired, attributions = chunks.delete_requests(engine_id, Request.finished_ts < finished_s)
        counts["requests_expired"] += expired
        over_cap, more = _requests_over_cap(
            chunks, engine_id, settings.retention_requests_per_engine
        )
        counts["requests_over_cap"] += over_cap
        counts["attributions"] += attributions + more
        counts["buckets_expired"] += chunks.delete_buckets(
            engine_id,
            HitRateBucket.bucket_start < expired_s,
            HitRateBucket.bucket_start + HitRateBucket.bucket_s <= expired_s,
        )
        counts["buckets_rolled_up"] += chunks.roll_up(
            engine_id, rollup_s, settings.retention_rollup_bucket_s
        )
    return Pruned(**counts)


def prune_round(
    db: Database,
    sessions: sessionmaker[Session],
    settings: Settings,
    now: datetime | None = None,
    stop: threading.Event | None = None,
) -> Pruned | None:
    """`prune`, on PostgreSQL only while this process holds the fleet's advisory lock: None
    when another replica holds it (that replica prunes this round)."""
    if db.dialect.name != "postgresql":
        return prune(sessions, settings, now, stop)
    with fleet_lock(db) as is_held:
        if not is_held:
            return None
        pruned = prune(sessions, settings, now, stop)
        if not (stop and stop.is_set()):
            _vacuum_without_autovacuum(db)
        return pruned


def _vacuum_without_autovacuum(db: Database) -> None:
    """On a PostgreSQL server whose autovacuum is off, VACUUM the store's tables: else the
    space of the rows pruned here (and of those ingest updates in place: blocks, shared
    units) is never reused and the files grow all the same. Plain VACUUM blocks no reads or
    writes, and skips the pages that have not changed; with autovacuum on, it is its work."""
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if connection.scalar(text("SHOW autovacuum")) == "on":
            return
        for table in Base.metadata.sorted_tables:
            connection.execute(text(f'VACUUM (SKIP_LOCKED) "{table.name}"'))


@contextmanager
def fleet_lock(db: Database) -> Iterator[bool]:
    """Try PostgreSQL's session-level advisory lock `LOCK_KEY` on a connection of its own, in
    autocommit (holding the lock holds no transaction open, so VACUUM is not held back);
    yields whether it was taken, and releases it at the end."""
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        is_held = bool(connection.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}))
        try:
            yield is_held
        finally:
            if is_held:
                try:
                    connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
                except DBAPIError:
                    connection.invalidate()  # closed: the server lets go of the lock itself


async def retention_loop(state: AppState) -> None:
    """Forever: wait `retention_interval_s`, then prune in a worker thread (`prune_round`).
    A database error is logged and the next round tries again. Cancelled, it asks the
    thread to stop after its chunk in flight, waits for it, and re-raises."""
    settings, metrics = state.settings, state.metrics
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(settings.retention_interval_s)
        stop = threading.Event()
        work = loop.run_in_executor(
            None, prune_round, state.db, state.sessions, settings, None, stop
        )
        try:
            pruned = await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()
            await asyncio.wait([work])
            if not work.cancelled() and work.exception() is not None:
                log.debug("retention round ended by shutdown: %s", work.exception())
            raise
        except SQLAlchemyError as exc:
            metrics.retention_rounds.labels("failed").inc()
            detail = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
            log.warning("retention round failed, trying again next round: %s", detail)
            continue
        except Exception:
            metrics.retention_rounds.labels("failed").inc()
            log.exception("retention round failed, trying again next round")
            continue
        if pruned is None:
            metrics.retention_rounds.labels("skipped").inc()
            log.debug("retention: another replica holds the lock; skipped this round")
            continue
        metrics.retention_rounds.labels("pruned").inc()
        for kind, num in pruned.by_kind().items():
            metrics.retention_rows.labels(kind).inc(num)
        if pruned.num_rows:
            done = ", ".join(f"{name} {num}" for name, num in pruned._asdict().items() if num)
            log.info("retention pruned %s", done)


# ---------------------------------------------------------------------------- rules
def _batches_over_cap(chunks: _Chunks, engine_id: str, epoch: int, keep: int) -> int:
    """Delete the engine's batches of `epoch` below its newest `keep` (by seq)."""
    with chunks.sessions() as session:
        oldest_kept = session.scalar(
            select(EventBatch.seq)
            .where(EventBatch.engine_id == engine_id, EventBatch.epoch == epoch)
            .order_by(EventBatch.seq.desc())
            .offset(keep - 1)
            .limit(1)
        )
    if oldest_kept is None:
        return 0
    batches: Table = EventBatch.__table__
    return chunks.delete_ids(
        batches,
        batches.c.engine_id == engine_id,
        batches.c.epoch == epoch,
        batches.c.seq < oldest_kept,
    )


def _requests_over_cap(chunks: _Chunks, engine_id: str, keep: int) -> tuple[int, int]:
    """Delete the engine's requests below its newest `keep` (by `finished_ts`, then id)."""
    with chunks.sessions() as session:
        oldest_kept = session.execute(
            select(Request.finished_ts, Request.id)
            .where(Request.engine_id == engine_id)
            .order_by(Request.finished_ts.desc(), Request.id.desc())
            .offset(keep - 1)
            .limit(1)
        ).first()
    if oldest_kept is None:
        return 0, 0
    finished_ts, request_id = oldest_kept
    older = or_(
        Request.finished_ts < finished_ts,
        and_(Request.finished_ts == finished_ts, Request.id < request_id),
    )
    return chunks.delete_requests(engine_id, older)


class _Chunks:
    """Deletes in transactions of at most `limit` rows, until a chunk comes back short (or
    `stop` is set); each method returns the rows it deleted."""

    def __init__(self, sessions: sessionmaker[Session], limit: int, stop: threading.Event):
        self.sessions, self.limit, self.stop = sessions, limit, stop

    def _repeat(self, chunk: Callable[[Session], tuple[int, int]]) -> tuple[int, int]:
        """Run `chunk` (rows taken, rows besides) a transaction at a time; their sums."""
        taken = besides = 0
        while not self.stop.is_set():
            with self.sessions() as session:
                num, more = chunk(session)
                session.commit()
            taken, besides = taken + num, besides + more
            if num < self.limit:
                break
        return taken, besides

    def delete_ids(self, table: Table, *where) -> int:
        ids = select(table.c.id).where(*where).limit(self.limit)
        stmt = delete(table).where(table.c.id.in_(ids))
        return self._repeat(lambda session: (session.execute(stmt).rowcount, 0))[0]

    def delete_requests(self, engine_id: str, *where) -> tuple[int, int]:
        """Delete the engine's requests matching `where`, with their attribution rows (done or
        pending); returns (requests, attribution rows)."""
        ids = select(Request.id).where(Request.engine_id == engine_id, *where).limit(self.limit)
        stmt = (
            delete(Request)
            .where(Request.id.in_(ids))
            .returning(Request.epoch, Request.arrival_index)
            .execution_options(synchronize_session=False)
        )

        def chunk(session: Session) -> tuple[int, int]:
            keys = session.execute(stmt).all()
            by_epoch = defaultdict(list)
            for epoch, arrival_index in keys:
                if arrival_index is not None:  # None: reported before attribution was
                    by_epoch[epoch].append(arrival_index)
            num = 0
            for table in (Attribution, PendingAttribution):
                for epoch, indexes in by_epoch.items():
                    for start in range(0, len(indexes), KEYS_PER_STATEMENT):
                        some = indexes[start : start + KEYS_PER_STATEMENT]
                        num += session.execute(
                            delete(table).where(
                                table.engine_id == engine_id,
                                table.epoch == epoch,
                                table.arrival_index.in_(some),
                            ),
                            execution_options={"synchronize_session": False},
                        ).rowcount
            return len(keys), num

        return self._repeat(chunk)

    def delete_buckets(self, engine_id: str, *where) -> int:
        starts = (
            select(HitRateBucket.bucket_start)
            .where(HitRateBucket.engine_id == engine_id, *where)
            .limit(self.limit)
        )
        stmt = (
            delete(HitRateBucket)
            .where(HitRateBucket.engine_id == engine_id, HitRateBucket.bucket_start.in_(starts))
            .execution_options(synchronize_session=False)
        )
        return self._repeat(lambda session: (session.execute(stmt).rowcount, 0))[0]

    def roll_up(self, engine_id: str, before_s: float, bucket_s: int) -> int:
        """Roll the engine's buckets finer than `bucket_s` into buckets of `bucket_s`, those
        whose coarse bucket ended by `before_s` (so no fine bucket of its span is young)."""
        # [0, end) holds the coarse buckets whose every fine one is old enough
        end = math.floor(before_s / bucket_s) * bucket_s
        fine = (BUCKETS.c.engine_id == engine_id, BUCKETS.c.bucket_s < bucket_s)
        starts = (
            select(BUCKETS.c.bucket_start)
            .where(*fine, BUCKETS.c.bucket_start < end)
            .order_by(BUCKETS.c.bucket_start)
            .limit(self.limit)
        )
        columns = [BUCKETS.c.engine_id, BUCKETS.c.bucket_start, *(BUCKETS.c[n] for n in COUNTERS)]
        stmt = delete(BUCKETS).where(*fine, BUCKETS.c.bucket_start.in_(starts)).returning(*columns)

        def chunk(session: Session) -> tuple[int, int]:
            rows = [row._mapping for row in session.execute(stmt)]
            coarse = hit_rate.roll_up(rows, bucket_s)
            bulk.upsert(session, BUCKETS, coarse, increment=COUNTERS)
            return len(rows), 0

        return self._repeat(chunk)[0]
