"""Engines without physical block ids (vLLM, SGLang through `junction attach`).

Such an engine's cache is kept hash-keyed (`peer_blocks`: per rank, group and medium, each
block's parent, token count and first tokens), with its churn per time bucket
(`peer_churn_buckets`), the scrapes of its Prometheus counters (`peer_metric_samples`) and the
gaps its bridge could not fill (`peer_resyncs`). `engines.num_peer_blocks` counts its
`peer_blocks` rows, for the per-engine cap (`JUNCTION_PEER_MAX_BLOCKS`) without a scan.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _engine_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE")


def _where() -> list[sa.Column]:
    """The key columns every table of a peer's cache starts with."""
    return [
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("rank", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("group", sa.String(64), nullable=False),
        sa.Column("medium", sa.String(32), nullable=False),
    ]


def upgrade() -> None:
    op.add_column(
        "engines",
        sa.Column("num_peer_blocks", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_table(
        "peer_blocks",
        *_where(),
        sa.Column("block_hash", sa.String(128), nullable=False),
        sa.Column("group_idx", sa.Integer(), nullable=False),
        sa.Column("parent_hash", sa.String(128), nullable=True),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("token_sample", sa.JSON(), nullable=False),
        sa.Column("stored_at", sa.Float(), nullable=False),
        _engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "rank", "group", "medium", "block_hash"),
    )
    op.create_table(
        "peer_churn_buckets",
        *_where(),
        sa.Column("bucket_start", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("bucket_s", sa.Integer(), nullable=False),
        sa.Column("num_stored", sa.BigInteger(), nullable=False),
        sa.Column("num_removed", sa.BigInteger(), nullable=False),
        _engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "rank", "group", "medium", "bucket_start"),
    )
    op.create_index(
        "ix_peer_churn_buckets_engine_start", "peer_churn_buckets", ["engine_id", "bucket_start"]
    )
    op.create_table(
        "peer_metric_samples",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("queries_tokens", sa.Float(), nullable=False),
        sa.Column("hits_tokens", sa.Float(), nullable=False),
        sa.Column("usage", sa.Float(), nullable=True),
        _engine_fk(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_peer_metric_samples_engine_ts", "peer_metric_samples", ["engine_id", "ts"])
    op.create_table(
        "peer_resyncs",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("first_missing_seq", sa.BigInteger(), nullable=False),
        sa.Column("resumed_seq", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        _engine_fk(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_peer_resyncs_engine_ts", "peer_resyncs", ["engine_id", "ts"])


def downgrade() -> None:
    op.drop_index("ix_peer_resyncs_engine_ts", table_name="peer_resyncs")
    op.drop_table("peer_resyncs")
    op.drop_index("ix_peer_metric_samples_engine_ts", table_name="peer_metric_samples")
    op.drop_table("peer_metric_samples")
    op.drop_index("ix_peer_churn_buckets_engine_start", table_name="peer_churn_buckets")
    op.drop_table("peer_churn_buckets")
    op.drop_table("peer_blocks")
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    op.drop_column("engines", "num_peer_blocks")
