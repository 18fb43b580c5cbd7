"""The store's tables (SQLAlchemy 2 ORM). Alembic owns the schema: see `migrations/`.

`blocks` mirrors each engine's block table row for row (`BlockPool.row`, with `token_range`
split into `token_start`/`token_end`); `event_batches` keeps every batch as it came;
`requests` and `hit_rate_buckets` are what `RequestFinished` events add up to; `pins` and
`pin_targets` hold the operator's pins and each engine's state of them (`api.fleet.pins`);
`dead_letters` the frames the store refused, parked so the stream went on
(`api.ingest.dead_letters`).
Engines without physical block ids (vLLM, SGLang: `api.peers.blocks`) keep `peer_blocks` (their
cache, hash-keyed), `peer_churn_buckets`, `peer_metric_samples` and `peer_resyncs`.
Miss attribution (`api.attribution.record`) keeps `shared_units` (each engine's salted match-unit
hashes, bounded), `pending_attributions` (requests waiting for the ones that arrived before
them) and `attributions` (each request's split of the tokens it missed), salted by the
one-row `attribution_salts` when no salt is set.
What-if replays (`api.whatif`) keep `request_chains` (each finished request's salted chain of
prompt and output, bounded, never served) and `whatif_runs` (a replay's settings, progress and
report).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, validates

from engine.geometry import CacheGeometry

#: An autoincrementing 64-bit key; SQLite only autoincrements `INTEGER PRIMARY KEY`.
BigId = BigInteger().with_variant(Integer(), "sqlite")
ENGINE_FK = "engines.engine_id"


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError(f"naive datetime {value} given; use UTC")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class GeometryJSON(TypeDecorator):
    """An engine's hello geometry (`engine.geometry.CacheGeometry`) in a JSON column: written
    as its plain JSON, read back with `CacheGeometry.from_json`, so a row an older engine wrote
    still loads (keys the struct does not know are ignored). A plain dict is written as is."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: CacheGeometry | dict | None, dialect) -> dict | None:
        return value.to_json() if isinstance(value, CacheGeometry) else value

    def process_result_value(self, value: object, dialect) -> CacheGeometry:
        return CacheGeometry.from_json(value)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UTCDateTime}


class Engine(Base):
    """One engine as its last hello described it; `next_seq` is the batch the store wants."""

    __tablename__ = "engines"

    engine_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    next_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    geometry: Mapped[CacheGeometry] = mapped_column(GeometryJSON, default=CacheGeometry)
    model: Mapped[dict[str, Any]] = mapped_column(default=dict)
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    # what the engine's outbox gave up in this epoch, as its last snapshot said
    num_batches_dropped: Mapped[int] = mapped_column(BigInteger, default=0)
    num_requests_dropped: Mapped[int] = mapped_column(BigInteger, default=0)
    last_drop: Mapped[str | None] = mapped_column(Text, default=None)
    # its `peer_blocks` rows (an engine without physical block ids), kept by the ingest that
    # writes them, so the per-engine cap needs no count
    num_peer_blocks: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # the replica that holds its socket (`api.fleet.replicas`), and that socket, while connected
    replica_id: Mapped[str | None] = mapped_column(String(64), default=None)
    connection_id: Mapped[str | None] = mapped_column(String(64), default=None)
    # the engine process that holds the id (its hello's `instance_id`; `api.ingest.lease`)
    instance_id: Mapped[str | None] = mapped_column(String(64), default=None)

    @validates("geometry")
    def _typed_geometry(self, _key: str, value: CacheGeometry | dict) -> CacheGeometry:
        """A plain dict given for the geometry is read as the store reads its rows."""
        return CacheGeometry.from_json(value)


class ApiSecret(Base):
    """A secret the replicas on one database share: `write_token`, the write token of
    replicas started without `JUNCTION_API_TOKEN` (`api.guards.shared_token`)."""

    __tablename__ = "api_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Replica(Base):
    """A live `junction api` process; one whose heartbeat is older than
    `JUNCTION_REPLICA_TIMEOUT_S` is dead, and its engines are disconnected."""

    __tablename__ = "replicas"

    replica_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class EventBatch(Base):
    __tablename__ = "event_batches"
    __table_args__ = (
        UniqueConstraint("engine_id", "epoch", "seq", name="uq_event_batches_seq"),
        Index("ix_event_batches_received_at", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(BigInteger)
    ts: Mapped[float] = mapped_column(Float)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    num_events: Mapped[int] = mapped_column(Integer)
    events: Mapped[list[Any]] = mapped_column()


class Block(Base):
    """A block-table row; `token_end is None` means the block holds no entry."""

    __tablename__ = "blocks"

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    group: Mapped[str] = mapped_column("group", String(16), primary_key=True)
    block_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(16))
    keys: Mapped[list[Any]] = mapped_column()
    token_start: Mapped[int | None] = mapped_column(BigInteger)
    token_end: Mapped[int | None] = mapped_column(BigInteger)
    is_partial: Mapped[bool] = mapped_column(Boolean)
    checkpoint_reason: Mapped[str | None] = mapped_column(String(16))
    ref_cnt: Mapped[int] = mapped_column(Integer)
    pinned: Mapped[bool] = mapped_column(Boolean)
    last_change: Mapped[int] = mapped_column(BigInteger)


class Request(Base):
    """A finished request, as its `RequestFinished` event reported it; `attention_match_key`
    and `junction_token_ids` are what the suggested junctions rank (`api.routes.junctions`)."""

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_engine_finished", "engine_id", "finished_ts"),
        Index("ix_requests_engine_request", "engine_id", "request_id"),
        Index("ix_requests_attention_match_key", "attention_match_key"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    request_id: Mapped[str] = mapped_column(Text)
    epoch: Mapped[int] = mapped_column(BigInteger)
    num_prompt_tokens: Mapped[int] = mapped_column(Integer)
    num_cached_tokens: Mapped[int] = mapped_column(Integer)
    hit_tokens_by_group: Mapped[dict[str, Any]] = mapped_column()
    num_computed_tokens: Mapped[int] = mapped_column(Integer)
    num_output_tokens: Mapped[int] = mapped_column(Integer)
    chunks: Mapped[list[Any]] = mapped_column()
    chunk_stop_reasons: Mapped[list[Any]] = mapped_column()
    checkpoints: Mapped[list[Any]] = mapped_column()
    num_preemptions: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str] = mapped_column(Text)
    arrival_ts: Mapped[float] = mapped_column(Float)
    first_token_ts: Mapped[float | None] = mapped_column(Float)
    finished_ts: Mapped[float] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    pin_hits: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    attention_match_key: Mapped[str | None] = mapped_column(String(128))
    junction_token_ids: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True))
    # each group's block table when the request finished (the dashboard outlines these)
    block_ids: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    # miss attribution: its place in the epoch's arrival order (None: recorded before it was
    # reported) and why its hit stopped (`MatchStop`); the event's `unit_hashes` are not kept
    arrival_index: Mapped[int | None] = mapped_column(BigInteger)
    oldest_unfinished_index: Mapped[int | None] = mapped_column(BigInteger)
    match_stop: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # what a what-if replays it with (None: recorded before engines reported them); its
    # salted chain is `request_chains`'
    arrival_step: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_offsets: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True))
    # its hit by the tier that served it ("device", "host", "disk", "shared") and the bytes read
    # from each tier below the device (None: nothing was loaded, the device served the hit)
    hit_tokens_by_tier: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    loaded_bytes_by_tier: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class TierUnit(Base):
    """A usable-hit unit an engine keeps in a tier below its device pools (`host`, `disk`,
    `shared`), as its `BlockStored`/`BlockRemoved` events of that medium said: the unit's key
    `H_end` and its parent's, its token range `[token_start, token_end)`, and `unit`, the key
    salted as miss attribution salts a request's chain (`api.attribution.unit_salt`). A removed
    unit keeps its row (`removed_ts`) for attribution until the retention window passes."""

    __tablename__ = "tier_units"
    __table_args__ = (Index("ix_tier_units_engine_unit", "engine_id", "unit"),)

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    tier: Mapped[str] = mapped_column(String(16), primary_key=True)
    unit_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    unit: Mapped[int] = mapped_column(BigInteger)
    parent_key: Mapped[str | None] = mapped_column(String(128))
    token_start: Mapped[int] = mapped_column(BigInteger)
    token_end: Mapped[int] = mapped_column(BigInteger)
    epoch: Mapped[int] = mapped_column(BigInteger)
    stored_ts: Mapped[float] = mapped_column(Float)
    removed_ts: Mapped[float | None] = mapped_column(Float)


class RequestLoad(Base):
    """A request's `UnitLoaded`: the hit tokens and bytes each tier served it, kept until its
    `RequestFinished` folds them into its `requests` row."""

    __tablename__ = "request_loads"
    __table_args__ = (Index("ix_request_loads_engine_request", "engine_id", "request_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str] = mapped_column(Text)
    tokens_by_tier: Mapped[dict[str, Any]] = mapped_column()
    bytes_by_tier: Mapped[dict[str, Any]] = mapped_column()
    loaded_ts: Mapped[float] = mapped_column(Float)


class AttributionSalt(Base):
    """The deployment's attribution salt when `JUNCTION_ATTRIBUTION_SALT` is unset: 32 random
    bytes made once (`id` 1), so that replicas and restarts salt alike."""

    __tablename__ = "attribution_salts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    salt: Mapped[bytes] = mapped_column(LargeBinary)


class SharedUnit(Base):
    """A match unit some finished sequence (a request's prompt and output, or a pinned prefix)
    of the engine held: `hash` is its salted unit hash (`api.attribution.record.salted`), never the
    engine's. `(first_epoch, first_index)` is the earliest arrival that held it,
    `first_finished_ts` the earliest finish of one, `last_seen_ts` the latest (what the
    retention window and the per-engine cap prune by); `last_epoch` the latest epoch that held
    it and `last_epoch_finished_ts` the earliest finish in that epoch (what tells a unit lost to
    an engine restart from one evicted)."""

    __tablename__ = "shared_units"
    __table_args__ = (Index("ix_shared_units_engine_seen", "engine_id", "last_seen_ts"),)

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    hash: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    first_epoch: Mapped[int] = mapped_column(BigInteger)
    first_index: Mapped[int] = mapped_column(BigInteger)
    first_finished_ts: Mapped[float] = mapped_column(Float)
    last_seen_ts: Mapped[float] = mapped_column(Float)
    last_epoch: Mapped[int] = mapped_column(BigInteger)
    last_epoch_finished_ts: Mapped[float] = mapped_column(Float)


class PendingAttribution(Base):
    """A finished request whose earlier arrivals have not all finished yet: what attributing
    it takes (its counts, `match_stop`, times) and `units`, its salted prompt chain (8 bytes a
    unit). Deleted once it is attributed."""

    __tablename__ = "pending_attributions"

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    arrival_index: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    num_prompt_tokens: Mapped[int] = mapped_column(Integer)
    num_cached_tokens: Mapped[int] = mapped_column(Integer)
    attention_hit_tokens: Mapped[int] = mapped_column(Integer)
    match_stop: Mapped[dict[str, Any]] = mapped_column()
    arrival_ts: Mapped[float] = mapped_column(Float)
    finished_ts: Mapped[float] = mapped_column(Float)
    units: Mapped[bytes] = mapped_column(LargeBinary)


class Attribution(Base):
    """A request's attribution: the prefix it truly shared with an earlier arrival or a pin
    (`shared_tokens`), the hit an unlimited cache would have given (`oracle_tokens`), and the
    tokens it missed of the shared prefix, by reason. Keyed as its request is (its engine,
    epoch and arrival index)."""

    __tablename__ = "attributions"

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    arrival_index: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    shared_tokens: Mapped[int] = mapped_column(Integer)
    oracle_tokens: Mapped[int] = mapped_column(Integer)
    missed_no_state: Mapped[int] = mapped_column(Integer, default=0)
    missed_in_flight: Mapped[int] = mapped_column(Integer, default=0)
    missed_held_back: Mapped[int] = mapped_column(Integer, default=0)
    missed_evicted: Mapped[int] = mapped_column(Integer, default=0)
    missed_restarted: Mapped[int] = mapped_column(Integer, default=0)
    missed_copy_pending: Mapped[int] = mapped_column(Integer, default=0)
    # `evicted` split by the tiers below the device (`workloads.attribute.splitter`)
    missed_evicted_host: Mapped[int] = mapped_column(Integer, default=0)
    missed_evicted_disk: Mapped[int] = mapped_column(Integer, default=0)
    missed_evicted_shared: Mapped[int] = mapped_column(Integer, default=0)
    missed_not_admitted: Mapped[int] = mapped_column(Integer, default=0)


class RequestChain(Base):
    """A finished request (or, `pin`, a materialized pin's prefix) as a what-if replays it:
    `units`, its salted chain of prompt and output (`api.attribution.unit_salt`, 8 bytes a
    unit, as `pending_attributions` packs them), its lengths, the hit it had, when it arrived
    (`arrival_step`) and where its chat messages ended. Never served by any route."""

    __tablename__ = "request_chains"
    __table_args__ = (Index("ix_request_chains_engine_finished", "engine_id", "finished_ts"),)

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    arrival_index: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    num_prompt_tokens: Mapped[int] = mapped_column(Integer)
    num_output_tokens: Mapped[int] = mapped_column(Integer)
    num_cached_tokens: Mapped[int] = mapped_column(Integer)
    arrival_step: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_offsets: Mapped[list[Any]] = mapped_column(default=list)
    pin: Mapped[bool] = mapped_column(Boolean, default=False)
    units: Mapped[bytes] = mapped_column(LargeBinary)
    finished_ts: Mapped[float] = mapped_column(Float)
    pin_id: Mapped[str | None] = mapped_column(Text)  # a pin's id (None: a request's chain)


class DeadLetter(Base):
    """A frame that decoded but that the store refused (`api.ingest.frames.Unstorable`), parked so
    the
    engine's stream went on: its seq counts as applied, its events were not. `frame` is the
    frame as JSON (a msgpack frame re-encoded), its first bytes only; `frame_bytes` its whole
    length. Each engine keeps its newest `JUNCTION_DEAD_LETTERS_PER_ENGINE`."""

    __tablename__ = "dead_letters"
    __table_args__ = (Index("ix_dead_letters_engine_id", "engine_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(BigInteger)
    frame_type: Mapped[str] = mapped_column(String(16))
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    reason: Mapped[str] = mapped_column(Text)
    frame: Mapped[str] = mapped_column(Text)
    frame_bytes: Mapped[int] = mapped_column(BigInteger)


class HitRateBucket(Base):
    """Token totals of the requests that finished in `[bucket_start, bucket_start + bucket_s)`."""

    __tablename__ = "hit_rate_buckets"

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    bucket_start: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    bucket_s: Mapped[int] = mapped_column(Integer)
    num_requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    attention_hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    mamba_hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    computed_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # miss attribution: the totals of the bucket's attributed requests (`api.attribution.record`)
    attributed_requests: Mapped[int] = mapped_column(BigInteger, default=0)
    attributed_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    attributed_hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    shared_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    oracle_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_no_state: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_in_flight: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_held_back: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_evicted: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_restarted: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_copy_pending: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_evicted_host: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_evicted_disk: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_evicted_shared: Mapped[int] = mapped_column(BigInteger, default=0)
    missed_not_admitted: Mapped[int] = mapped_column(BigInteger, default=0)
    # hit tokens the tiers below the device served and the bytes read for them, by the batch
    # that loaded them (`UnitLoaded`; the device's share is `cached_tokens` less these)
    host_hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    disk_hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    shared_hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    host_loaded_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    disk_loaded_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    shared_loaded_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class Pin(Base):
    """A pinned prefix: an operator's (`origin` "api", made through `POST /pins`) or one an
    engine reported that the API never made (`origin` "engine": a replay trace's pin line).

    `target_mode` "all" targets every engine, connected now or later; "list" only the engines
    of its `PinTarget` rows. `token_ids` is None for an engine's pin: the store never saw its
    tokens, so it cannot send it anywhere. `released_at` set: the pin is released."""

    __tablename__ = "pins"

    pin_id: Mapped[str] = mapped_column(Text, primary_key=True)
    label: Mapped[str] = mapped_column(Text)
    origin: Mapped[str] = mapped_column(String(16))
    token_ids: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True))
    num_tokens: Mapped[int] = mapped_column(BigInteger)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    target_mode: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column()
    # the prefix as given when it was `text` or `messages` ({"text": ...} or {"messages": [...]}):
    # every command carries it, for each engine to tokenize with its own tokenizer
    source: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class PinTarget(Base):
    """One engine's side of a pin: its boundary on that engine's hit grid (None: the engine's
    geometry gives no grid) and the state its `PinUpdated` events last reported.

    `is_held` is the engine's last word: it said it holds the pin (pending or materialized),
    so a released pin must still be unpinned there. `num_hits` and `tokens_saved` add up the
    engine's requests whose hit covered the pin (`RequestFinished.pin_hits`)."""

    __tablename__ = "pin_targets"

    pin_id: Mapped[str] = mapped_column(
        ForeignKey("pins.pin_id", ondelete="CASCADE"), primary_key=True
    )
    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    boundary: Mapped[int | None] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    keys: Mapped[dict[str, Any]] = mapped_column(default=dict)
    block_ids: Mapped[dict[str, Any]] = mapped_column(default=dict)
    is_held: Mapped[bool] = mapped_column(Boolean, default=False)
    num_hits: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_saved: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class BenchmarkRun(Base):
    """A benchmark run (`bench.BenchmarkSpec` in `spec`), queued by `POST /benchmarks`
    or the nightly suite and run by a Celery worker (`jobs.runs`).

    `status` goes queued -> running -> finished | failed; a failed run says why in `error`.
    `heartbeat_at` is the worker's last sign of life (start or progress): a running run whose
    heartbeat is too old is swept to failed ("worker lost"). `attempts` counts the starts."""

    __tablename__ = "benchmark_runs"
    __table_args__ = (Index("ix_benchmark_runs_status_created", "status", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    results: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    name: Mapped[str] = mapped_column(Text, default="", server_default="")
    progress: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    progress_message: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    task_id: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(Text)


class PeerBlock(Base):
    """A block of an engine without physical block ids, as its `PeerBlockStored` said: keyed by
    its rank, group, medium and hash; `parent_hash` is the block before it in its chain (None
    at the root), `token_sample` its first `JUNCTION_PEER_TOKEN_SAMPLE` token ids, `stored_at`
    the Unix seconds of the batch that stored it last."""

    __tablename__ = "peer_blocks"

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    group: Mapped[str] = mapped_column("group", String(64), primary_key=True)
    medium: Mapped[str] = mapped_column(String(32), primary_key=True)
    block_hash: Mapped[str] = mapped_column(String(128), primary_key=True)
    group_idx: Mapped[int] = mapped_column(Integer)
    parent_hash: Mapped[str | None] = mapped_column(String(128))
    num_tokens: Mapped[int] = mapped_column(Integer)
    token_sample: Mapped[list[Any]] = mapped_column()
    stored_at: Mapped[float] = mapped_column(Float)


class PeerChurnBucket(Base):
    """Blocks a peer stored and removed (a clear's included) in `[bucket_start, +bucket_s)`."""

    __tablename__ = "peer_churn_buckets"
    __table_args__ = (Index("ix_peer_churn_buckets_engine_start", "engine_id", "bucket_start"),)

    engine_id: Mapped[str] = mapped_column(
        ForeignKey(ENGINE_FK, ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    group: Mapped[str] = mapped_column("group", String(64), primary_key=True)
    medium: Mapped[str] = mapped_column(String(32), primary_key=True)
    bucket_start: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    bucket_s: Mapped[int] = mapped_column(Integer)
    num_stored: Mapped[int] = mapped_column(BigInteger, default=0)
    num_removed: Mapped[int] = mapped_column(BigInteger, default=0)


class PeerMetricSample(Base):
    """One scrape of a peer's Prometheus counters (`PeerMetrics`): cumulative tokens, at `ts`
    (the scrape's Unix seconds)."""

    __tablename__ = "peer_metric_samples"
    __table_args__ = (Index("ix_peer_metric_samples_engine_ts", "engine_id", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    queries_tokens: Mapped[float] = mapped_column(Float)
    hits_tokens: Mapped[float] = mapped_column(Float)
    usage: Mapped[float | None] = mapped_column(Float)


class PeerResyncRecord(Base):
    """A gap in a peer's stream the bridge could not fill (`PeerResync`), or stores the store
    refused for its cap (`reason` "store full: ...", the seqs those of the wire's batches);
    `ts` is its batch's."""

    __tablename__ = "peer_resyncs"
    __table_args__ = (Index("ix_peer_resyncs_engine_ts", "engine_id", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    first_missing_seq: Mapped[int] = mapped_column(BigInteger)
    resumed_seq: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    ts: Mapped[float] = mapped_column(Float)


class WhatIfRun(Base):
    """A what-if replay of an engine's recorded chains (`request_chains` of `epoch`) under
    `settings` (`whatif.settings.WhatIfSetting`s as JSON), queued by `POST
    /engines/{id}/whatif` and run by a Celery worker (`jobs.whatif`).

    `status` goes queued -> running -> done | failed; `progress_done` of `progress_total`
    requests replayed; `result` the report (`WhatIfReport.as_dict()`); `error` why it failed.
    `heartbeat_at` and `attempts` fence a worker's writes as a benchmark run's do."""

    __tablename__ = "whatif_runs"
    __table_args__ = (
        Index("ix_whatif_runs_engine_created", "engine_id", "created_at"),
        Index("ix_whatif_runs_status_finished", "status", "finished_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[str] = mapped_column(ForeignKey(ENGINE_FK, ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    settings: Mapped[list[Any]] = mapped_column(default=list)
    progress_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    progress_total: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    task_id: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(Text)
