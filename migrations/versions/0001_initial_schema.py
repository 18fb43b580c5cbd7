"""Initial schema: engines, event batches, blocks, requests, hit-rate buckets, pins, benchmarks.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIMESTAMP = sa.DateTime(timezone=True)


def engine_fk(ondelete: str = "CASCADE") -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete=ondelete)


def upgrade() -> None:
    op.create_table(
        "engines",
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("next_seq", sa.BigInteger(), nullable=False),
        sa.Column("geometry", sa.JSON(), nullable=False),
        sa.Column("model", sa.JSON(), nullable=False),
        sa.Column("connected", sa.Boolean(), nullable=False),
        sa.Column("first_seen", TIMESTAMP, nullable=False),
        sa.Column("last_seen", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("engine_id"),
    )
    op.create_table(
        "event_batches",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("received_at", TIMESTAMP, nullable=False),
        sa.Column("num_events", sa.Integer(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        engine_fk(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("engine_id", "epoch", "seq", name="uq_event_batches_seq"),
    )
    _compress_events_with_lz4()
    op.create_table(
        "blocks",
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("group", sa.String(16), nullable=False),
        sa.Column("block_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("keys", sa.JSON(), nullable=False),
        sa.Column("token_start", sa.BigInteger(), nullable=True),
        sa.Column("token_end", sa.BigInteger(), nullable=True),
        sa.Column("is_partial", sa.Boolean(), nullable=False),
        sa.Column("checkpoint_reason", sa.String(16), nullable=True),
        sa.Column("ref_cnt", sa.Integer(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("last_change", sa.BigInteger(), nullable=False),
        engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "group", "block_id"),
    )
    op.create_table(
        "requests",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("num_prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("num_cached_tokens", sa.Integer(), nullable=False),
        sa.Column("hit_tokens_by_group", sa.JSON(), nullable=False),
        sa.Column("num_computed_tokens", sa.Integer(), nullable=False),
        sa.Column("num_output_tokens", sa.Integer(), nullable=False),
        sa.Column("chunks", sa.JSON(), nullable=False),
        sa.Column("chunk_stop_reasons", sa.JSON(), nullable=False),
        sa.Column("checkpoints", sa.JSON(), nullable=False),
        sa.Column("num_preemptions", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.Text(), nullable=False),
        sa.Column("arrival_ts", sa.Float(), nullable=False),
        sa.Column("first_token_ts", sa.Float(), nullable=True),
        sa.Column("finished_ts", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        engine_fk(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_requests_engine_finished", "requests", ["engine_id", "finished_ts"])
    op.create_index("ix_requests_engine_request", "requests", ["engine_id", "request_id"])
    op.create_table(
        "hit_rate_buckets",
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("bucket_start", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("bucket_s", sa.Integer(), nullable=False),
        sa.Column("num_requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("attention_hit_tokens", sa.BigInteger(), nullable=False),
        sa.Column("mamba_hit_tokens", sa.BigInteger(), nullable=False),
        sa.Column("computed_tokens", sa.BigInteger(), nullable=False),
        engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "bucket_start"),
    )
    op.create_table(
        "pins",
        sa.Column("pin_id", sa.Text(), nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("boundary", sa.BigInteger(), nullable=True),
        sa.Column("num_tokens", sa.BigInteger(), nullable=True),
        sa.Column("keys", sa.JSON(), nullable=False),
        sa.Column("block_ids", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        engine_fk(ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("pin_id"),
    )
    op.create_table(
        "benchmark_runs",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def _compress_events_with_lz4() -> None:
    """Batches are large JSON documents: lz4 stores them about twice as fast as PostgreSQL's
    default pglz (where the server has lz4: PostgreSQL 14 and up, built with it)."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or op.get_context().as_sql:
        return
    methods = bind.exec_driver_sql(
        "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
    ).scalar()
    if methods is not None and "lz4" in methods:
        op.execute("ALTER TABLE event_batches ALTER COLUMN events SET COMPRESSION lz4")


def downgrade() -> None:
    op.drop_table("benchmark_runs")
    op.drop_table("pins")
    op.drop_table("hit_rate_buckets")
    op.drop_index("ix_requests_engine_request", table_name="requests")
    op.drop_index("ix_requests_engine_finished", table_name="requests")
    op.drop_table("requests")
    op.drop_table("blocks")
    op.drop_table("event_batches")
    op.drop_table("engines")
