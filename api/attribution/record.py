"""Miss attribution at ingest: the online oracle, request by request (docs/api.md).

Each engine's finished sequences (a request's prompt and output, a materialized pin's prefix)
leave their match-unit hashes in `shared_units`, salted (`api.attribution.unit_salt`: the
engine's raw hashes are never stored), each with the earliest arrival `(epoch, arrival_index)`
that held it, the earliest finish of one, and the latest epoch that held it (a unit finished
only in an earlier epoch was lost to the engine's restart: `restarted`, not `evicted`). A
request is attributed once every request that arrived before it has finished: when some
event's `oldest_unfinished_index` passes its arrival index (or a newer epoch starts). Until
then it waits in `pending_attributions`. Its shared length L
is U times the leading units of its prompt that an earlier arrival held; `capped_hit` of L is
the oracle hit, and `workloads.misses.split_misses` splits L minus the hit by reason
(`workloads.attribute.attribute_units`, which the engine's diagnosis shares).

Everything here runs inside the caller's ingest transaction, a few statements per group of
batches whatever the number of requests: one upsert of the units (on PostgreSQL it hands
their records back), one read of the other records a request needs (on SQLite, all of them),
one delete of the pending rows now due (`RETURNING` them), one insert each of attributions and
pending rows, their bucket totals added to the caller's (one upsert for both), and on every
`shared_units.CAP_CHECK_EVERY`th seq a bounded prune. The same salted chains (each unit salted
once) are kept whole, request by request, for what-if replays (`api.attribution.request_chains`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import Table, delete
from sqlalchemy.orm import Session

from api.attribution import request_chains, shared_units, unit_salt
from api.attribution import tiers as tier_attribution
from api.attribution.hit_rate import ATTRIBUTION_COUNTERS, add_buckets, bucket_row
from api.settings import Settings
from api.store import bulk
from api.store.models import Attribution, PendingAttribution
from engine.events import ATTENTION, PinUpdated, RequestFinished
from engine.geometry import CacheGeometry
from workloads import attribute as chains
from workloads.misses import HitGrid, MatchStop
from workloads.oracle import capped_hit

PENDING: Table = PendingAttribution.__table__
ATTRIBUTIONS: Table = Attribution.__table__


@dataclass(frozen=True)
class AttributionConfig:
    """The attribution settings (`JUNCTION_ATTRIBUTION_*`); `salt` None: the store's own;
    `max_requests` the request chains kept for what-if replays (`JUNCTION_WHATIF_MAX_REQUESTS`)."""

    salt: bytes | None = None
    window_s: float = 86400.0
    max_units: int = 1_000_000
    max_requests: int = 100_000

    @classmethod
    def from_settings(cls, settings: Settings) -> AttributionConfig:
        secret = settings.attribution_salt
        return cls(
            unit_salt.setting_salt(secret.get_secret_value()) if secret is not None else None,
            settings.attribution_window_s,
            settings.attribution_max_units,
            settings.whatif_max_requests,
        )


class Subject(NamedTuple):
    """A finished request as attribution needs it (its `RequestFinished`, or its pending row)."""

    epoch: int
    arrival_index: int
    num_prompt_tokens: int
    num_cached_tokens: int
    attention_hit_tokens: int
    match_stop: dict
    arrival_ts: float
    finished_ts: float
    units: list[int]  # its salted prompt chain


# ---------------------------------------------------------------------------- ingest
def record_frames(
    session: Session,
    engine_id: str,
    epoch: int,
    geometry: CacheGeometry,
    finished: Sequence[RequestFinished],
    pins: Iterable[tuple[PinUpdated, float]],
    now_ts: float,
    config: AttributionConfig,
    bucket_s: int,
    buckets: dict[int, dict],
    check_cap: bool = False,
) -> None:
    """Record the frames' sequences (`finished` in event order, `pins` reported with the batch
    ts as their finish: the materialized ones for attribution, every queued prefill for what-if
    replays), then attribute every request whose earlier arrivals have all
    finished and keep the others pending, and keep every chain for what-if replays; with
    `check_cap` (every `CAP_CHECK_EVERY`th seq, and snapshots), prune the units and the chains
    past the window and the caps. The attributed requests' totals are added to `buckets`
    (`bucket_row`'s), which the caller writes with its own."""
    grid = HitGrid.of(geometry)
    # the requests attribution needs (a match stop) and those a what-if replays (a chain)
    finished = [e for e in finished if e.match_stop is not None or e.unit_hashes]
    # a pin's prefill, once queued (it has an arrival index), caches its prefix whether the pin
    # then holds or fails: a what-if replays it; attribution counts the materialized ones
    pins = [(pin, ts) for pin, ts in pins if pin.arrival_index is not None and pin.unit_hashes]
    if grid is not None and (finished or pins):
        _record(session, engine_id, epoch, grid, finished, pins, config, bucket_s, buckets)
    if check_cap:
        shared_units.prune(session, engine_id, now_ts, config.window_s, config.max_units, True)
        request_chains.prune(session, engine_id, now_ts, config.window_s, config.max_requests)


def _record(
    session: Session,
    engine_id: str,
    epoch: int,
    grid: HitGrid,
    finished: list[RequestFinished],
    pins: list[tuple[PinUpdated, float]],
    config: AttributionConfig,
    bucket_s: int,
    buckets: dict[int, dict],
) -> None:
    """`record_frames` for the finished requests that reported their match stop or a chain
    and the materialized pins, on the engine's hit grid."""
    salt = config.salt or unit_salt.store_salt(session)
    seen: dict[bytes, int] = {}  # the frames' chains share their prefixes: salt each unit once
    chains = [unit_salt.salted_chain(event.unit_hashes, salt, seen) for event in finished]
    pin_chains = [unit_salt.salted_chain(pin.unit_hashes, salt, seen) for pin, _ in pins]
    request_chains.keep(
        session,
        engine_id,
        epoch,
        zip(finished, chains, strict=True),
        [(pin, ts, chain) for (pin, ts), chain in zip(pins, pin_chains, strict=True)],
    )
    units: dict[int, list] = {}
    subjects = []
    reported = []
    for event, chain in zip(finished, chains, strict=True):
        if event.match_stop is None:
            continue
        reported.append(event)
        shared_units.merge(units, chain, epoch, event.arrival_index, event.finished_ts)
        subjects.append(_subject(event, epoch, chain[: event.num_prompt_tokens // grid.unit]))
    for (pin, ts), chain in zip(pins, pin_chains, strict=True):
        if pin.state == "materialized":
            shared_units.merge(units, chain, epoch, pin.arrival_index, ts)
    written = shared_units.upsert(session, engine_id, units)
    oldest = max((event.oldest_unfinished_index for event in reported), default=0)
    due = [s for s in subjects if s.arrival_index < oldest]
    waiting = [s for s in subjects if s.arrival_index >= oldest]
    due += _take_pending(session, engine_id, PendingAttribution.epoch == epoch, oldest)
    _attribute(session, engine_id, due, grid, bucket_s, buckets, written)
    bulk.insert_missing(session, PENDING, [_pending_row(engine_id, s) for s in waiting])


def flush_epoch(
    session: Session, engine_id: str, new_epoch: int, geometry: CacheGeometry, bucket_s: int
) -> None:
    """A newer epoch started: the requests of older ones still pending will see no more
    arrivals finish, so attribute them now (with their epoch's `geometry`)."""
    due = _take_pending(session, engine_id, PendingAttribution.epoch != new_epoch, None)
    grid = HitGrid.of(geometry)
    if grid is not None:
        buckets: dict[int, dict] = {}
        _attribute(session, engine_id, due, grid, bucket_s, buckets)
        add_buckets(session, buckets)


def _subject(event: RequestFinished, epoch: int, units: list[int]) -> Subject:
    stop = event.match_stop
    return Subject(
        epoch,
        event.arrival_index,
        event.num_prompt_tokens,
        event.num_cached_tokens,
        event.hit_tokens_by_group.get(ATTENTION, 0),
        {name: getattr(stop, name) for name in MatchStop._fields},
        event.arrival_ts,
        event.finished_ts,
        units,
    )


def _pending_row(engine_id: str, subject: Subject) -> dict:
    row = subject._asdict()
    row["units"] = unit_salt.pack(subject.units)
    return {"engine_id": engine_id, **row}


def _take_pending(session: Session, engine_id: str, where, below: int | None) -> list[Subject]:
    """The engine's pending requests matching `where` (arrival index below `below`), deleted."""
    conditions = [PendingAttribution.engine_id == engine_id, where]
    if below is not None:
        conditions.append(PendingAttribution.arrival_index < below)
    fields = [f for f in Subject._fields if f != "units"]
    columns = [PENDING.c[f] for f in fields]
    taken = delete(PENDING).where(*conditions).returning(*columns, PENDING.c.units)
    return [Subject(*row[:-1], unit_salt.unpack(row[-1])) for row in session.execute(taken)]


def _attribute(
    session: Session,
    engine_id: str,
    subjects: list[Subject],
    grid: HitGrid,
    bucket_s: int,
    buckets: dict[int, dict],
    written: dict[int, shared_units.Record] | None = None,
) -> None:
    """Attribute `subjects` (their earlier arrivals all finished): their rows, and their
    totals added to `buckets` (by `finished_ts`, as the hit rate's). `written`: records just
    upserted (as stored now), so only the other units are read."""
    if not subjects:
        return
    written = written or {}
    wanted = {u for s in subjects for u in s.units}
    records = written | shared_units.records(session, engine_id, wanted - written.keys())
    tiers = None
    if grid.has_tiers or tier_attribution.has_tiers(session, engine_id):
        tiers = tier_attribution.records(session, engine_id, wanted)
    rows = []
    for subject in sorted(subjects, key=lambda s: (s.epoch, s.arrival_index)):
        row = attribute(subject, records, grid, tiers)
        rows.append({"engine_id": engine_id, "epoch": subject.epoch} | row)
        bucket = bucket_row(buckets, engine_id, subject.finished_ts, bucket_s)
        bucket["attributed_requests"] += 1
        bucket["attributed_prompt_tokens"] += subject.num_prompt_tokens
        bucket["attributed_hit_tokens"] += subject.num_cached_tokens
        for name in ATTRIBUTION_COUNTERS[3:]:
            bucket[name] += row[name]
    bulk.insert_missing(session, ATTRIBUTIONS, rows)


def attribute(
    subject: Subject,
    records: dict[int, shared_units.Record],
    grid: HitGrid,
    tiers: dict[int, list[tier_attribution.TierRecord]] | None = None,
) -> dict:
    """The attribution row of one request (without its engine and epoch); `tiers` the tier
    rows of its units, on an engine with tiers below the device (None: none). Reads only."""
    shared, missed = chains.attribute_units(
        chains.Subject(
            subject.epoch,
            subject.arrival_index,
            subject.arrival_ts,
            subject.num_cached_tokens,
            subject.attention_hit_tokens,
            MatchStop(**subject.match_stop),
            subject.units,
        ),
        records,
        grid,
        tiers,
    )
    return {
        "arrival_index": subject.arrival_index,
        "shared_tokens": shared,
        "oracle_tokens": capped_hit(shared, subject.num_prompt_tokens, grid.unit, grid.eagle),
        **{f"missed_{reason}": n for reason, n in missed.items()},
    }
