"""Engines without physical block ids at ingest: their hash-keyed cache, churn, metrics, resyncs.

vLLM and SGLang publish their KV-cache events keyed by block hash alone; `junction attach`
bridges them in as the peer events of `engine.events` (`PEER_EVENTS`), over the same socket
and protocol engines use, with a hello whose geometry says `"physical_block_ids": false`
(`CacheGeometry.is_peer`). Only such an engine's batches are looked at here: any other engine
pays nothing.

`apply` runs inside the batches' own transaction (`api.ingest.frames.apply_batches`), so a batch is
applied exactly once, acked after its commit. The events are folded in order into one delete
and one upsert of `peer_blocks` (the last event of a block wins: a store after a removal stores
it, a removal after a store removes it); a `PeerCacheCleared` first writes what came before
it, then deletes the rank's rows (of its medium, or all). Churn buckets add up the blocks each
event stored and removed (a clear: the rows it deleted), by rank, group, medium and bucket of
the batch's ts; resyncs and metric samples are inserted as they came.

Bounds (`PeerConfig`): an engine keeps at most `max_blocks` rows (`Engine.num_peer_blocks`
counts them, so no statement counts). A store of a new block past it is refused: the block is
not kept (stores of blocks already kept, removals and clears still apply, so the table fills
again once the peer frees blocks), the batch is applied and acked all the same, and the
refusal is recorded as a resync of the rank with reason "store full: ...", its seqs the
wire's batches (`[first_missing_seq, resumed_seq)`: the batches whose new blocks were not
all kept). Churn buckets, metric samples and resyncs older than `window_s` are pruned, and
beyond `max_samples` samples or resyncs per engine the oldest go, every `PRUNE_EVERY` seqs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
from sqlalchemy import String, Table, bindparam, delete, func, select, text, tuple_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from api.settings import Settings
from api.store import bulk
from api.store.models import Engine, PeerBlock, PeerChurnBucket, PeerMetricSample, PeerResyncRecord
from engine.events import (
    PeerBlockRemoved,
    PeerBlockStored,
    PeerCacheCleared,
    PeerMetrics,
    PeerResync,
)
from engine.wire import Batch

PEER_BLOCKS: Table = PeerBlock.__table__
CHURN: Table = PeerChurnBucket.__table__
SAMPLES: Table = PeerMetricSample.__table__
RESYNCS: Table = PeerResyncRecord.__table__
CHURN_COUNTERS = ("num_stored", "num_removed")
PRUNE_EVERY = 64  # the windows and sample caps are pruned on every 64th seq (a count is a scan)
SQLITE_KEYS_CHUNK = 2000  # keys of 4 columns a statement: SQLite's 32766 parameters leave room
UPDATED = ("group_idx", "parent_hash", "num_tokens", "token_sample", "stored_at")
KIND_JUNCTION = "junction"  # the summary's `kind` of an engine with physical block ids

Key = tuple[int, str, str, str]  # (rank, group, medium, block hash): a row of an engine's table


@dataclass(frozen=True)
class PeerConfig:
    """The peer settings (`JUNCTION_PEER_*`)."""

    token_sample: int = 32
    max_blocks: int = 1_000_000
    window_s: float = 86400.0
    max_samples: int = 100_000

    @classmethod
    def from_settings(cls, settings: Settings) -> PeerConfig:
        return cls(
            settings.peer_token_sample,
            settings.peer_max_blocks,
            settings.peer_window_s,
            settings.peer_max_samples,
        )


def kind(engine: Engine) -> str:
    """The peer's kind ("vllm", "sglang", ...), or "junction" for an engine with block ids."""
    if not engine.geometry.is_peer:
        return KIND_JUNCTION
    return engine.geometry.kind or "peer"


def without_tokens(event):
    """The event as `event_batches` keeps it: a store without its token ids (the table keeps
    each block's first few; the whole prompt is never kept)."""
    if isinstance(event, PeerBlockStored) and event.token_ids:
        return msgspec.structs.replace(event, token_ids=[])
    return event


def forget_blocks(session: Session, engine: Engine) -> None:
    """Delete the engine's table (a new epoch: the peer's cache starts empty)."""
    session.execute(delete(PeerBlock).where(PeerBlock.engine_id == engine.engine_id))
    engine.num_peer_blocks = 0


def apply(
    session: Session, engine: Engine, batches: list[Batch], bucket_s: int, config: PeerConfig
) -> None:
    """Apply the peer events of new, consecutive `batches` of `engine` (its row locked by the
    caller's transaction), in order. Commits nothing."""
    writer = _Writer(session, engine, bucket_s, config)
    samples, resyncs = [], []
    for batch in batches:
        for event in batch.events:
            if isinstance(event, PeerBlockStored):
                writer.store(event, batch)
            elif isinstance(event, PeerBlockRemoved):
                writer.remove(event, batch.ts)
            elif isinstance(event, PeerCacheCleared):
                writer.clear(event, batch.ts)
            elif isinstance(event, PeerMetrics):
                samples.append(_sample_row(engine.engine_id, event))
            elif isinstance(event, PeerResync):
                resyncs.append(_resync_row(engine.engine_id, event, batch.ts))
    writer.flush()
    engine.num_peer_blocks = writer.num_blocks  # once: a dirty row would flush before each read
    bulk.upsert(session, CHURN, list(writer.churn.values()), increment=CHURN_COUNTERS)
    bulk.insert_rows(session, SAMPLES, samples)
    bulk.insert_rows(session, RESYNCS, resyncs + writer.refusals(batches[-1].seq))
    first, last = batches[0].seq, batches[-1].seq
    if last // PRUNE_EVERY * PRUNE_EVERY >= first:  # a multiple of PRUNE_EVERY among them
        prune(session, engine.engine_id, batches[-1].ts, config)


def prune(session: Session, engine_id: str, now_ts: float, config: PeerConfig) -> None:
    """Delete the engine's churn buckets, samples and resyncs from over `window_s` before
    `now_ts`, then its oldest samples and resyncs beyond `max_samples` of each."""
    cutoff = now_ts - config.window_s
    churn = PeerChurnBucket
    session.execute(delete(churn).where(churn.engine_id == engine_id, churn.bucket_start < cutoff))
    for model in (PeerMetricSample, PeerResyncRecord):
        mine = model.engine_id == engine_id
        session.execute(delete(model).where(mine, model.ts < cutoff))
        count = session.scalar(select(func.count()).select_from(model).where(mine)) or 0
        if count > config.max_samples:
            oldest = (
                select(model.id)
                .where(mine)
                .order_by(model.ts, model.id)
                .limit(count - config.max_samples)
            )
            session.execute(delete(model).where(mine, model.id.in_(oldest)))


class _Writer:
    """The table's changes since the last write, folded: `upserts` (each key's last store,
    with its batch's seq) and `deletes`, which `flush` writes, deletes first."""

    def __init__(self, session: Session, engine: Engine, bucket_s: int, config: PeerConfig):
        self.session, self.engine, self.bucket_s, self.config = session, engine, bucket_s, config
        self.num_blocks = engine.num_peer_blocks  # the engine's rows, as the writes leave them
        self.upserts: dict[Key, tuple[dict, int, float]] = {}
        self.deletes: set[Key] = set()
        self.churn: dict[tuple[int, str, str, int], dict] = {}
        self.refused: dict[int, list] = {}  # rank -> [num_blocks, first seq, ts of the last]

    def store(self, event: PeerBlockStored, batch: Batch) -> None:
        size, tokens, sample = event.block_size, event.token_ids, self.config.token_sample
        parent = event.parent_block_hash
        for index, block_hash in enumerate(event.block_hashes):
            start = index * size
            # the last block may be short of `block_size` tokens; a store without tokens is full
            num_tokens = max(0, min(size, len(tokens) - start)) if tokens else size
            key = (event.rank, event.group, event.medium, block_hash)
            row = {
                "engine_id": self.engine.engine_id,
                "rank": event.rank,
                "group": event.group,
                "medium": event.medium,
                "block_hash": block_hash,
                "group_idx": event.group_idx,
                "parent_hash": parent,
                "num_tokens": num_tokens,
                "token_sample": tokens[start : start + min(num_tokens, sample)],
                "stored_at": batch.ts,
            }
            self.deletes.discard(key)
            self.upserts.pop(key, None)  # re-inserted last: the dict keeps the stores' order
            self.upserts[key] = (row, batch.seq, batch.ts)
            parent = block_hash
        if event.block_hashes:
            churn = self._churn(event.rank, event.group, event.medium, batch.ts)
            churn["num_stored"] += len(event.block_hashes)

    def remove(self, event: PeerBlockRemoved, ts: float) -> None:
        for block_hash in event.block_hashes:
            key = (event.rank, event.group, event.medium, block_hash)
            self.upserts.pop(key, None)
            self.deletes.add(key)
        if event.block_hashes:
            churn = self._churn(event.rank, event.group, event.medium, ts)
            churn["num_removed"] += len(event.block_hashes)

    def clear(self, event: PeerCacheCleared, ts: float) -> None:
        self.flush()  # what came before the clear, so that it is cleared too
        where = [PeerBlock.engine_id == self.engine.engine_id, PeerBlock.rank == event.rank]
        if event.medium is not None:
            where.append(PeerBlock.medium == event.medium)
        counts = self.session.execute(
            select(PeerBlock.group, PeerBlock.medium, func.count())
            .where(*where)
            .group_by(PeerBlock.group, PeerBlock.medium)
        ).all()
        self.session.execute(delete(PeerBlock).where(*where))
        for group, medium, count in counts:
            self._churn(event.rank, group, medium, ts)["num_removed"] += count
            self.num_blocks -= count

    def flush(self) -> None:
        """Write the folded deletes, then the upserts: the new blocks past the cap are
        refused (the first ones, in the order they were stored, are kept)."""
        session, engine_id = self.session, self.engine.engine_id
        if self.deletes:
            self.num_blocks -= _delete_keys(session, engine_id, self.deletes)
            self.deletes = set()
        if not self.upserts:
            return
        if self.num_blocks + len(self.upserts) > self.config.max_blocks or not _is_pg(session):
            stored = _stored_keys(session, engine_id, self.upserts)
            new = [key for key in self.upserts if key not in stored]
            room = max(0, self.config.max_blocks - self.num_blocks)
            for key in new[room:]:
                _, seq, ts = self.upserts.pop(key)
                refused = self.refused.setdefault(key[0], [0, seq, ts])
                refused[0] += 1
                refused[2] = ts
            bulk.upsert(session, PEER_BLOCKS, [row for row, _, _ in self.upserts.values()])
            self.num_blocks += min(len(new), room)
        else:  # room for all of them: the upsert itself says which were new
            self.num_blocks += _upsert_counting(
                session, [row for row, _, _ in self.upserts.values()]
            )
        self.upserts = {}

    def refusals(self, last_seq: int) -> list[dict]:
        """A resync row per rank whose new blocks the cap refused."""
        cap = self.config.max_blocks
        return [
            {
                "engine_id": self.engine.engine_id,
                "rank": rank,
                "first_missing_seq": first_seq,
                "resumed_seq": last_seq + 1,
                "reason": f"store full: {num} new blocks not kept (JUNCTION_PEER_MAX_BLOCKS={cap})",
                "ts": ts,
            }
            for rank, (num, first_seq, ts) in sorted(self.refused.items())
        ]

    def _churn(self, rank: int, group: str, medium: str, ts: float) -> dict:
        start = int(ts // self.bucket_s) * self.bucket_s
        key = (rank, group, medium, start)
        row = self.churn.get(key)
        if row is None:
            row = self.churn[key] = {
                "engine_id": self.engine.engine_id,
                "rank": rank,
                "group": group,
                "medium": medium,
                "bucket_start": start,
                "bucket_s": self.bucket_s,
                "num_stored": 0,
                "num_removed": 0,
            }
        return row


def _stored_keys(session: Session, engine_id: str, keys: Iterable[Key]) -> set[Key]:
    """Which of `keys` the engine's table holds (one statement on PostgreSQL)."""
    keys = set(keys)
    hashes = list({key[3] for key in keys})
    columns = (PeerBlock.rank, PeerBlock.group, PeerBlock.medium, PeerBlock.block_hash)
    mine = PeerBlock.engine_id == engine_id
    found: set[Key] = set()
    if _is_pg(session):
        param = bindparam("hashes", hashes, type_=ARRAY(String()))
        is_listed = PeerBlock.block_hash == func.any(param)
        rows = session.execute(select(*columns).where(mine, is_listed))
        found.update(tuple(row) for row in rows)
    else:
        for start in range(0, len(hashes), SQLITE_KEYS_CHUNK):
            chunk = hashes[start : start + SQLITE_KEYS_CHUNK]
            rows = session.execute(select(*columns).where(mine, PeerBlock.block_hash.in_(chunk)))
            found.update(tuple(row) for row in rows)
    return found & keys


def _upsert_counting(session: Session, rows: list[dict]) -> int:
    """`bulk.upsert` of `peer_blocks` rows on PostgreSQL; returns how many were new."""
    columns = ", ".join(f'"{name}"' for name in rows[0])
    keys = ", ".join(f'"{column.name}"' for column in PEER_BLOCKS.primary_key.columns)
    changes = ", ".join(f'"{name}" = excluded."{name}"' for name in rows[0] if name in UPDATED)
    sql = text(
        f"INSERT INTO peer_blocks ({columns}) SELECT {columns} FROM json_populate_recordset("
        f"NULL::peer_blocks, CAST(:rows AS json)) ON CONFLICT ({keys}) DO UPDATE SET {changes}"
        " RETURNING (xmax = 0)"  # a row version no transaction replaced: inserted
    )
    inserted = session.execute(sql, {"rows": msgspec.json.encode(rows).decode()}).scalars()
    return sum(inserted)


def _delete_keys(session: Session, engine_id: str, keys: set[Key]) -> int:
    """Delete the engine's rows of `keys`; returns how many there were."""
    if _is_pg(session):
        rows = [{"rank": r, "group": g, "medium": m, "block_hash": h} for r, g, m, h in keys]
        sql = text(
            "DELETE FROM peer_blocks AS p USING json_to_recordset(CAST(:rows AS json)) AS k(rank "
            'integer, "group" text, medium text, block_hash text) WHERE p.engine_id = :engine_id'
            ' AND p.rank = k.rank AND p."group" = k."group" AND p.medium = k.medium'
            " AND p.block_hash = k.block_hash"
        )
        rows_json = msgspec.json.encode(rows).decode()
        return session.execute(sql, {"rows": rows_json, "engine_id": engine_id}).rowcount
    columns = tuple_(PeerBlock.rank, PeerBlock.group, PeerBlock.medium, PeerBlock.block_hash)
    listed, removed = list(keys), 0
    for start in range(0, len(listed), SQLITE_KEYS_CHUNK):
        chunk = listed[start : start + SQLITE_KEYS_CHUNK]
        stmt = delete(PeerBlock).where(PeerBlock.engine_id == engine_id, columns.in_(chunk))
        removed += session.execute(stmt).rowcount
    return removed


def _sample_row(engine_id: str, event: PeerMetrics) -> dict:
    return {
        "engine_id": engine_id,
        "rank": event.rank,
        "ts": event.scraped_ts,
        "queries_tokens": event.queries_tokens,
        "hits_tokens": event.hits_tokens,
        "usage": event.usage,
    }


def _resync_row(engine_id: str, event: PeerResync, ts: float) -> dict:
    return {
        "engine_id": engine_id,
        "rank": event.rank,
        "first_missing_seq": event.first_missing_seq,
        "resumed_seq": event.resumed_seq,
        "reason": event.reason,
        "ts": ts,
    }


def _is_pg(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"
