"""The store's tables (SQLAlchemy 2 ORM). Alembic owns the schema: see `migrations/`.

`blocks` mirrors each engine's block table row for row (`BlockPool.row`, with `token_range`
split into `token_start`/`token_end`); `event_batches` keeps every batch as it came;
`requests` and `hit_rate_buckets` are what `RequestFinished` events add up to.
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
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

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


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UTCDateTime}


class Engine(Base):
    """One engine as its last hello described it; `next_seq` is the batch the store wants."""

    __tablename__ = "engines"

    engine_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    next_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    geometry: Mapped[dict[str, Any]] = mapped_column(default=dict)
    model: Mapped[dict[str, Any]] = mapped_column(default=dict)
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)


class EventBatch(Base):
    __tablename__ = "event_batches"
    __table_args__ = (UniqueConstraint("engine_id", "epoch", "seq", name="uq_event_batches_seq"),)

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
    """A finished request, as its `RequestFinished` event reported it."""

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_engine_finished", "engine_id", "finished_ts"),
        Index("ix_requests_engine_request", "engine_id", "request_id"),
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


class Pin(Base):
    """An operator's pin; `engine_id` is the engine that last reported it (None: not yet)."""

    __tablename__ = "pins"

    pin_id: Mapped[str] = mapped_column(Text, primary_key=True)
    engine_id: Mapped[str | None] = mapped_column(ForeignKey(ENGINE_FK, ondelete="SET NULL"))
    state: Mapped[str] = mapped_column(String(16))
    boundary: Mapped[int | None] = mapped_column(BigInteger)
    num_tokens: Mapped[int | None] = mapped_column(BigInteger)
    keys: Mapped[dict[str, Any]] = mapped_column(default=dict)
    block_ids: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class BenchmarkRun(Base):
    __tablename__ = "benchmark_runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    results: Mapped[dict[str, Any] | None] = mapped_column(JSON)
