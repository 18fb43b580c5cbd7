"""Applying the engine's frames to the store: plain functions over a `Session`.

Each function is one transaction: it commits what the frame means, or raises and leaves the
store as it was. The seq bookkeeping is `Engine.next_seq`, per engine and epoch:

- `apply_hello`: refused while another engine process holds the id, or for an epoch far
  ahead of the clock (`api.ingest.lease`). An epoch newer than the stored one is a restarted
  engine: its block rows go,
  the pins it held are lost (`api.fleet.pins.on_hello`: active ones are pending again, to be
  resent),
  and `next_seq` starts at 0. The same epoch (a reconnect) keeps `next_seq`, so the engine
  resends from there. An older epoch is refused (`CLOSE_WRONG_ENGINE`) and changes nothing: a
  stale engine, or anyone with the token, cannot wipe the live engine's table.
- `apply_batch`: `seq < next_seq` was committed before: acknowledged, not applied again.
  `seq == next_seq`: stored and applied, `next_seq += 1`. `seq > next_seq` is a gap the
  engine must fill (resend or snapshot): `CLOSE_FUTURE_SEQ`. `apply_batches` takes
  consecutive batches in one transaction, as `apply_batch` would one after another.
- `apply_snapshot`: any `seq >= next_seq` replaces the engine's block rows and pin states,
  stores the finished requests it carries (those of batches it replaced that the store had not
  committed) and sets `next_seq = seq + 1`; an older snapshot is acknowledged and dropped.
- `apply_parked`: a batch or snapshot the store refused (`Unstorable`: a constraint, a value
  beyond its column, a limit of the database; retrying will not help) becomes a dead letter
  (`api.ingest.dead_letters`) and its seq counts as applied, so the stream goes on without it.

Only `BlockStateChanged` (whole block rows), `RequestFinished` (requests, buckets, pin hits,
miss attribution), `PinUpdated` (pin targets, pinned prefixes for attribution) and the tiers'
`BlockStored`/`BlockRemoved` (medium `host`, `disk`, `shared`) and `UnitLoaded`
(`api.ingest.tiers`) change tables besides `event_batches`; the other events are kept in their
batch for readers of
`/events`, without the prompt-derived fields (`unit_hashes`, `junction_token_ids`) that only
`api.attribution.record` and the requests table use. An engine without physical block ids (its
hello's geometry says `physical_block_ids: false`, `CacheGeometry.is_peer`) sends the peer
events instead, which
`api.peers.blocks` applies in the same transaction (and its stored batches keep no token ids);
for any other engine they are not looked for. Rows go in with one statement per table
(`api.store.bulk`). What the pins' reports call for (an unpin of a released pin the engine still
holds) comes back in `Applied.commands`, for the socket to send after the ack.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import msgspec
from sqlalchemy import JSON, Table, Text, bindparam, cast, delete, insert, select, update
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from api.attribution import record as attribution
from api.attribution import shared_units
from api.attribution.hit_rate import add_buckets, bucket_row
from api.attribution.record import AttributionConfig
from api.fleet import pins
from api.ingest import dead_letters
from api.ingest import tiers as tier_units
from api.ingest.lease import LeaseConfig, check_hello
from api.peers import blocks as peer_blocks
from api.peers.blocks import PeerConfig
from api.store import bulk
from api.store.models import Block, Engine, EventBatch, Request, utcnow
from engine.events import ATTENTION, INT64_MAX, MAMBA
from engine.wire import (
    CLOSE_BAD_FRAME,
    CLOSE_FUTURE_SEQ,
    CLOSE_WRONG_ENGINE,
    Ack,
    Batch,
    BlockRow,
    BlockStateChanged,
    Command,
    Hello,
    PinUpdated,
    RequestFinished,
    Snapshot,
    Welcome,
    WireError,
)

BLOCKS: Table = Block.__table__
REQUESTS: Table = Request.__table__
BATCHES: Table = EventBatch.__table__
ENGINES: Table = Engine.__table__
_EVENTS = msgspec.json.Encoder()  # a batch's events as `event_batches` keeps them
# PostgreSQL's class 54, "program limit exceeded" (an index row over the btree's limit, a
# statement too complex): psycopg reports it as an `OperationalError`, like a lost connection,
# but it is the frame's fault and comes back at every retry
PROGRAM_LIMIT_EXCEEDED = "54"


class Applied(NamedTuple):
    ack: Ack
    is_duplicate: bool
    num_events: int
    commands: tuple[Command, ...] = ()  # to send the engine after the ack
    is_parked: bool = False  # refused by the store, kept as a dead letter, acked all the same


class Unstorable(WireError):
    """A frame that decoded but that the store refuses, for a reason retrying will not fix.
    The socket parks a batch or snapshot (`apply_parked`); anything else closes with 4400."""

    def __init__(self, reason: str) -> None:
        super().__init__(CLOSE_BAD_FRAME, reason)


def is_refusal(exc: BaseException) -> bool:
    """Whether the database refused the statement for what it holds (a constraint, a value
    beyond its column, a limit), not because it could not be reached."""
    if isinstance(exc, DataError | IntegrityError | OverflowError):
        return True
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return isinstance(exc, OperationalError) and str(sqlstate).startswith(PROGRAM_LIMIT_EXCEEDED)


@contextmanager
def transaction(session: Session) -> Iterator[None]:
    """Commit, or roll back and raise; what the database refuses to hold (an integer beyond
    its column, a broken constraint, an index row too big) is the frame's fault: `Unstorable`."""
    try:
        yield
        session.commit()
    except BaseException as exc:
        session.rollback()
        if not is_refusal(exc):
            raise
        detail = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [repr(exc)])[0]
        raise Unstorable(f"the store cannot hold a value: {detail}") from exc


# ---------------------------------------------------------------------------- frames
def apply_hello(
    session: Session,
    hello: Hello,
    bucket_s: int = 60,
    lease: LeaseConfig | None = None,
    holder: tuple[str, str] | None = None,
) -> Welcome:
    """`holder`: the replica and the socket (`connection_id`) that took the hello, recorded
    with it, so the lease (`api.ingest.lease`) holds from this commit on."""
    with transaction(session):
        now = utcnow()
        engine = session.get(Engine, hello.engine_id, with_for_update=True, populate_existing=True)
        check_hello(session, engine, hello, lease or LeaseConfig(), now)
        if engine is not None and hello.epoch < engine.epoch:
            raise WireError(
                CLOSE_WRONG_ENGINE,
                f"hello of epoch {hello.epoch} is older than the stored epoch {engine.epoch}"
                " (another engine with this id?)",
            )
        restarted = engine is not None and engine.epoch != hello.epoch
        if engine is None:
            engine = Engine(engine_id=hello.engine_id, epoch=hello.epoch, next_seq=0)
            engine.first_seen = now
            session.add(engine)
        elif restarted:
            attribution.flush_epoch(
                session, engine.engine_id, hello.epoch, engine.geometry, bucket_s
            )
            session.execute(delete(Block).where(Block.engine_id == hello.engine_id))
            peer_blocks.forget_blocks(session, engine)
            tier_units.on_restart(session, engine.engine_id, now.timestamp())
            engine.epoch = hello.epoch
            engine.next_seq = 0
            engine.num_batches_dropped = engine.num_requests_dropped = 0  # counts are per epoch
            engine.last_drop = None
        engine.geometry = hello.geometry
        engine.model = dict(hello.model)
        engine.connected = True
        engine.last_seen = now
        engine.instance_id = hello.instance_id or None
        if holder is not None:
            engine.replica_id, engine.connection_id = holder
        pins.on_hello(session, engine, restarted)
        return Welcome(epoch=engine.epoch, next_seq=engine.next_seq)


def apply_batch(
    session: Session,
    hello: Hello,
    batch: Batch,
    bucket_s: int = 60,
    config: AttributionConfig | None = None,
    peer: PeerConfig | None = None,
) -> Applied:
    return apply_batches(session, hello, [batch], bucket_s, config, peer)[0]


def apply_batches(
    session: Session,
    hello: Hello,
    batches: list[Batch],
    bucket_s: int = 60,
    config: AttributionConfig | None = None,
    peer: PeerConfig | None = None,
) -> list[Applied]:
    """Consecutive batches of one connection in one transaction, each taken as `apply_batch`
    takes it alone, with one statement per table for all of them (the last row of a block
    wins); the pins' reports and hits are applied batch by batch, in order. A batch that
    cannot be applied rolls back all of them."""
    with transaction(session):
        for batch in batches:
            _check_frame(hello, batch)
        # the usual case in one statement: the batches are the next ones, and this claims them
        claimed = _claim_seqs(session, hello, batches)
        next_seq = batches[0].seq if claimed else _locked_next_seq(session, hello)
        is_new = []
        for batch in batches:
            if batch.seq > next_seq:
                raise WireError(CLOSE_FUTURE_SEQ, f"expected seq {next_seq}, got {batch.seq}")
            is_new.append(batch.seq == next_seq)
            next_seq += is_new[-1]
        new = [batch for batch, fresh in zip(batches, is_new, strict=True) if fresh]
        commands = {}
        if new:
            commands = _store_batches(session, hello, new, bucket_s, config or AttributionConfig())
            if hello.geometry.is_peer:
                engine = session.get(Engine, hello.engine_id)  # locked above
                peer_blocks.apply(session, engine, new, bucket_s, peer or PeerConfig())
            if not claimed:
                session.execute(
                    update(ENGINES)
                    .where(ENGINES.c.engine_id == hello.engine_id)
                    .values(next_seq=next_seq, last_seen=utcnow())
                )
        return [
            Applied(Ack(seq=b.seq), False, len(b.events), commands[b.seq])
            if fresh
            else Applied(Ack(seq=b.seq), True, 0)
            for b, fresh in zip(batches, is_new, strict=True)
        ]


def _store_batches(
    session: Session, hello: Hello, new: list[Batch], bucket_s: int, config: AttributionConfig
) -> dict[int, tuple[Command, ...]]:
    """Store new batches, in seq order; returns the commands each calls for, by seq."""
    engine_id, epoch = hello.engine_id, hello.epoch  # the batches' own (`_check_frame`)
    kept = _peer_without_prompt if hello.geometry.is_peer else _without_prompt
    received_at = utcnow()
    session.execute(
        insert(BATCHES).values(events=_raw_json(session, "events_json")),
        [
            {
                "engine_id": engine_id,
                "epoch": epoch,
                "seq": batch.seq,
                "ts": batch.ts,
                "received_at": received_at,
                "num_events": len(batch.events),
                # encoded here, in C: the column's type would encode with `json.dumps`
                "events_json": _EVENTS.encode([kept(e) for e in batch.events]).decode(),
            }
            for batch in new
        ],
    )
    # the last row of each block: the wire bounds every integer of a `BlockRow` to its column
    # (`Count32`, `Int`, `Count`), so a row a later batch replaces is one the store could hold
    latest: dict[tuple[str, int], BlockRow] = {}
    finished: list[list[RequestFinished]] = [[] for _ in new]
    reports: list[list[PinUpdated]] = [[] for _ in new]
    for index, batch in enumerate(new):
        for event in batch.events:
            if isinstance(event, BlockStateChanged):
                latest.update({(row.group, row.block_id): row for row in event.blocks})
            elif isinstance(event, RequestFinished):
                finished[index].append(event)
            elif isinstance(event, PinUpdated):
                reports[index].append(event)
    bulk.upsert(session, BLOCKS, [_block_values(engine_id, r) for r in latest.values()])
    all_finished = [e for f in finished for e in f]
    buckets: dict[int, dict] = {}  # the requests' totals and the attributed ones', one upsert
    if not hello.geometry.is_peer:  # the tiers' units and loads, before attribution reads them
        tier_units.apply(session, engine_id, epoch, new, config.salt, bucket_s, buckets)
    _insert_requests(session, engine_id, epoch, all_finished, bucket_s, buckets)
    attribution.record_frames(
        session,
        engine_id,
        epoch,
        hello.geometry,
        all_finished,
        [(r, b.ts) for b, its in zip(new, reports, strict=True) for r in its],
        new[-1].ts,
        config,
        bucket_s,
        buckets,
        check_cap=any(b.seq % shared_units.CAP_CHECK_EVERY == 0 for b in new),
    )
    if any(b.seq % shared_units.CAP_CHECK_EVERY == 0 for b in new):
        tier_units.prune(session, engine_id, new[-1].ts, config.window_s, config.max_units)
    add_buckets(session, buckets)
    commands = {}
    for batch, its_reports, its_finished in zip(new, reports, finished, strict=True):
        sent = pins.apply_reports(session, engine_id, its_reports) if its_reports else []
        if its_finished:
            pins.record_hits(session, engine_id, its_finished)
        commands[batch.seq] = tuple(sent)
    return commands


def apply_snapshot(
    session: Session,
    hello: Hello,
    snapshot: Snapshot,
    bucket_s: int = 60,
    config: AttributionConfig | None = None,
) -> Applied:
    with transaction(session):
        _check_frame(hello, snapshot)
        engine = _locked_engine(session, hello)
        if snapshot.seq < engine.next_seq:
            return Applied(Ack(seq=snapshot.seq), True, 0)
        if snapshot.seq >= INT64_MAX:
            raise Unstorable(
                f"snapshot seq {snapshot.seq} is the last seq the store holds: no frame could "
                f"follow it (an engine counts seqs from 0 in each epoch)"
            )
        # the finished requests of the batches the snapshot replaced, but those of a batch the
        # store committed already (its seq below next_seq: the engine never saw the ack)
        carried = [r.event for r in snapshot.requests if r.seq >= engine.next_seq]
        buckets: dict[int, dict] = {}
        _insert_requests(session, snapshot.engine_id, snapshot.epoch, carried, bucket_s, buckets)
        pins.record_hits(session, snapshot.engine_id, carried)
        attribution.record_frames(
            session,
            snapshot.engine_id,
            snapshot.epoch,
            hello.geometry,
            carried,
            [(pin, snapshot.ts) for pin in snapshot.pins],
            snapshot.ts,
            config or AttributionConfig(),
            bucket_s,
            buckets,
            check_cap=True,
        )
        add_buckets(session, buckets)
        rows = {(row.group, row.block_id): row for row in snapshot.blocks}
        session.execute(delete(Block).where(Block.engine_id == snapshot.engine_id))
        bulk.insert_rows(
            session, BLOCKS, [_block_values(snapshot.engine_id, r) for r in rows.values()]
        )
        commands = pins.apply_reports(
            session, snapshot.engine_id, snapshot.pins, snapshot_seq=snapshot.seq
        )
        engine.next_seq = snapshot.seq + 1
        engine.last_seen = utcnow()
        engine.num_batches_dropped = snapshot.num_batches_dropped
        engine.num_requests_dropped = snapshot.num_requests_dropped
        engine.last_drop = snapshot.last_drop
        return Applied(Ack(seq=snapshot.seq), False, 0, tuple(commands))


def apply_parked(
    session: Session,
    hello: Hello,
    frame: Batch | Snapshot,
    reason: str,
    keep: int = 1000,
    max_bytes: int = 64 * 1024,
) -> Applied:
    """Park a frame the store refused (`Unstorable`, with its `reason`): it becomes the engine's
    newest dead letter (of at most `keep`, its first `max_bytes` of JSON) and its seq counts as
    applied, so the frames after it go on. None of its events are applied: block rows it
    carried come back with their blocks' next change or the next snapshot."""
    with transaction(session):
        _check_frame(hello, frame)
        engine = _locked_engine(session, hello)
        if frame.seq < engine.next_seq:  # committed meanwhile, by another socket of the engine
            return Applied(Ack(seq=frame.seq), True, 0)
        if isinstance(frame, Batch) and frame.seq > engine.next_seq:
            raise WireError(CLOSE_FUTURE_SEQ, f"expected seq {engine.next_seq}, got {frame.seq}")
        kept = _frame_without_prompt(frame)
        dead_letters.park(session, hello.engine_id, hello.epoch, kept, reason, keep, max_bytes)
        engine.next_seq = min(frame.seq + 1, INT64_MAX)  # a frame at the last seq parks too
        engine.last_seen = utcnow()
        return Applied(Ack(seq=frame.seq), False, 0, is_parked=True)


#: the latest timestamp the store's columns hold (9999-12-31): a finished request's times past
#: it (a finite 1e300) cannot be stored, and are parked without the rest of their frame
MAX_TS = 253402300799.0


def request_problem(event: RequestFinished) -> str | None:
    """Why the store cannot hold this finished request, or None."""
    for name in ("arrival_ts", "first_token_ts", "finished_ts"):
        value = getattr(event, name)
        if value is not None and not -MAX_TS <= value <= MAX_TS:
            return f"request {event.request_id!r}: {name} {value!r} is past what the store holds"
    return None


def split_unstorable(
    frame: Batch | Snapshot,
) -> tuple[Batch | Snapshot, Batch | Snapshot, str] | None:
    """A refused frame's finished requests the store cannot hold, apart: (the frame without
    them, a frame of them alone, why), or None when no request explains the refusal or
    nothing else is left to store (a batch of only those)."""
    if isinstance(frame, Batch):
        problems = [
            (e, request_problem(e) if isinstance(e, RequestFinished) else None)
            for e in frame.events
        ]
    else:
        problems = [(r, request_problem(r.event)) for r in frame.requests]
    bad = [item for item, problem in problems if problem]
    kept = [item for item, problem in problems if not problem]
    if not bad or (isinstance(frame, Batch) and not kept):
        return None
    why = "; ".join(problem for _, problem in problems if problem)
    if isinstance(frame, Batch):
        return (
            msgspec.structs.replace(frame, events=kept),
            msgspec.structs.replace(frame, events=bad),
            why,
        )
    return (
        msgspec.structs.replace(frame, requests=kept),
        msgspec.structs.replace(frame, requests=bad, blocks=[], pins=[]),
        why,
    )


def park_items(
    session: Session,
    hello: Hello,
    frame: Batch | Snapshot,
    reason: str,
    keep: int = 1000,
    max_bytes: int = 64 * 1024,
) -> None:
    """Park `frame` (what a stored frame left out: the items the store cannot hold) as the
    engine's newest dead letter, its seq untouched (the rest of its frame took it)."""
    with transaction(session):
        _check_frame(hello, frame)
        kept = _frame_without_prompt(frame)
        dead_letters.park(session, hello.engine_id, hello.epoch, kept, reason, keep, max_bytes)


# ---------------------------------------------------------------------------- helpers
def _raw_json(session: Session, name: str):
    """A bind parameter for a JSON column that takes JSON text already serialized (an
    `executemany` of these costs PostgreSQL less than one `json_populate_recordset` array
    holding every batch's events, which it would parse once more)."""
    param = bindparam(name, type_=Text())
    return cast(param, JSON) if session.get_bind().dialect.name == "postgresql" else param


def _check_frame(hello: Hello, frame: Batch | Snapshot) -> None:
    """Raises unless the frame is for the connection's engine and epoch."""
    if frame.engine_id != hello.engine_id:
        raise WireError(
            CLOSE_WRONG_ENGINE,
            f"{frame.type} for engine {frame.engine_id!r} on the connection of "
            f"engine {hello.engine_id!r}",
        )
    if frame.epoch != hello.epoch:
        raise WireError(
            CLOSE_WRONG_ENGINE,
            f"{frame.type} of epoch {frame.epoch} on a connection of epoch {hello.epoch}",
        )


def _without_prompt(event):
    """The event as the store keeps it: a finished request or pin without its unit hashes
    (attribution keeps only salted ones) or its junction's tokens (the requests table has
    them for the suggested junctions)."""
    if isinstance(event, RequestFinished):
        return msgspec.structs.replace(event, unit_hashes="", junction_token_ids=None)
    if isinstance(event, PinUpdated) and event.unit_hashes:
        return msgspec.structs.replace(event, unit_hashes="")
    return event


def _peer_without_prompt(event):
    """An event of an engine without physical block ids, as the store keeps it."""
    return peer_blocks.without_tokens(_without_prompt(event))


def _frame_without_prompt(frame: Batch | Snapshot) -> Batch | Snapshot:
    """A frame to park as a dead letter, its events as `_peer_without_prompt` keeps them."""
    if isinstance(frame, Batch):
        events = [_peer_without_prompt(e) for e in frame.events]
        return msgspec.structs.replace(frame, events=events)
    requests = [msgspec.structs.replace(r, event=_without_prompt(r.event)) for r in frame.requests]
    return msgspec.structs.replace(
        frame, requests=requests, pins=[_without_prompt(p) for p in frame.pins]
    )


def _claim_seqs(session: Session, hello: Hello, batches: list[Batch]) -> bool:
    """Whether `batches` were consecutive from the engine's `next_seq`, now moved past them (the
    row locked, as `_locked_next_seq` locks it); False changes and locks nothing: the batches
    start elsewhere (a resend of committed ones, a gap), or the epoch was superseded."""
    first = batches[0].seq
    if any(batch.seq != first + i for i, batch in enumerate(batches)):
        return False
    claim = (
        update(ENGINES)
        .where(
            ENGINES.c.engine_id == hello.engine_id,
            ENGINES.c.epoch == hello.epoch,
            ENGINES.c.next_seq == first,
        )
        .values(next_seq=first + len(batches), last_seen=utcnow())
    )
    return session.execute(claim).rowcount == 1


def _locked_next_seq(session: Session, hello: Hello) -> int:
    """`_locked_engine`'s check and lock without the ORM (one row, two columns): the next seq
    the connection's engine wants."""
    row = session.execute(
        select(ENGINES.c.epoch, ENGINES.c.next_seq)
        .where(ENGINES.c.engine_id == hello.engine_id)
        .with_for_update()
    ).one_or_none()
    if row is None:
        raise WireError(CLOSE_WRONG_ENGINE, f"engine {hello.engine_id!r} is not registered")
    if row.epoch != hello.epoch:
        raise WireError(
            CLOSE_WRONG_ENGINE,
            f"epoch {hello.epoch} of engine {hello.engine_id!r} was superseded by {row.epoch}",
        )
    return row.next_seq


def _locked_engine(session: Session, hello: Hello) -> Engine:
    """The connection's engine row, locked (PostgreSQL) so two sockets of one engine cannot
    both take the same seq; raises when the connection's epoch is no longer the engine's."""
    engine = session.get(Engine, hello.engine_id, with_for_update=True, populate_existing=True)
    if engine is None:
        raise WireError(CLOSE_WRONG_ENGINE, f"engine {hello.engine_id!r} is not registered")
    if engine.epoch != hello.epoch:
        raise WireError(
            CLOSE_WRONG_ENGINE,
            f"epoch {hello.epoch} of engine {hello.engine_id!r} was superseded by {engine.epoch}",
        )
    return engine


def _block_values(engine_id: str, row: BlockRow) -> dict:
    start, end = row.token_range if row.token_range is not None else (None, None)
    return {
        "engine_id": engine_id,
        "group": row.group,
        "block_id": row.block_id,
        "state": row.state,
        "keys": list(row.keys),
        "token_start": start,
        "token_end": end,
        "is_partial": row.is_partial,
        "checkpoint_reason": row.checkpoint_reason,
        "ref_cnt": row.ref_cnt,
        "pinned": row.pinned,
        "last_change": row.last_change,
    }


def _insert_requests(
    session: Session,
    engine_id: str,
    epoch: int,
    finished: list[RequestFinished],
    bucket_s: int,
    buckets: dict[int, dict],
) -> None:
    """Store the finished requests; their totals go into `buckets` (`bucket_row`'s)."""
    if not finished:
        return
    loaded = tier_units.fold(session, engine_id, epoch, finished)
    values = []
    for event in finished:
        row = msgspec.to_builtins(event)  # lists for tuples, as JSON columns hold them
        del row["type"], row["unit_hashes"]  # attribution keeps only salted hashes
        tokens, sizes = loaded.get(event.request_id, (None, None))
        row["hit_tokens_by_tier"], row["loaded_bytes_by_tier"] = tokens, sizes
        values.append({"engine_id": engine_id, "epoch": epoch, **row})
        bucket = bucket_row(buckets, engine_id, event.finished_ts, bucket_s)
        bucket["num_requests"] += 1
        bucket["prompt_tokens"] += event.num_prompt_tokens
        bucket["cached_tokens"] += event.num_cached_tokens
        bucket["attention_hit_tokens"] += event.hit_tokens_by_group.get(ATTENTION, 0)
        bucket["mamba_hit_tokens"] += event.hit_tokens_by_group.get(MAMBA, 0)
        bucket["computed_tokens"] += event.num_computed_tokens
    bulk.insert_rows(session, REQUESTS, values)
