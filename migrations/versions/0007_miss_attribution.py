"""Miss attribution: salted match-unit hashes, pending and attributed requests, bucket totals.

`RequestFinished` now says where each request arrived (`arrival_index`), which arrivals had all
finished (`oldest_unfinished_index`) and why its hit stopped (`match_stop`); the requests
table keeps them. The control plane attributes each request's missed tokens online
(`api.attribution.record`): `shared_units` holds each engine's salted unit hashes (never the raw
ones), `pending_attributions` the requests whose earlier arrivals have not all finished,
`attributions` the split of each request's misses, and `hit_rate_buckets` their totals.
`attribution_salts` keeps the salt made at first use when `JUNCTION_ATTRIBUTION_SALT` is unset.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REASONS = ("no_state", "in_flight", "held_back", "evicted", "copy_pending")
BUCKET_COLUMNS = (
    "attributed_requests",
    "attributed_prompt_tokens",
    "attributed_hit_tokens",
    "shared_tokens",
    "oracle_tokens",
    *(f"missed_{reason}" for reason in REASONS),
)


def _engine_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE")


def _request_key() -> list[sa.Column]:
    return [
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("arrival_index", sa.BigInteger(), autoincrement=False, nullable=False),
    ]


def upgrade() -> None:
    op.add_column("pins", sa.Column("source", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("requests", sa.Column("arrival_index", sa.BigInteger(), nullable=True))
    op.add_column("requests", sa.Column("oldest_unfinished_index", sa.BigInteger(), nullable=True))
    op.add_column("requests", sa.Column("match_stop", sa.JSON(none_as_null=True), nullable=True))
    for column in BUCKET_COLUMNS:
        op.add_column(
            "hit_rate_buckets",
            sa.Column(column, sa.BigInteger(), nullable=False, server_default="0"),
        )
    op.create_table(
        "attribution_salts",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("salt", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "shared_units",
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("hash", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("first_epoch", sa.BigInteger(), nullable=False),
        sa.Column("first_index", sa.BigInteger(), nullable=False),
        sa.Column("first_finished_ts", sa.Float(), nullable=False),
        sa.Column("last_seen_ts", sa.Float(), nullable=False),
        _engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "hash"),
    )
    op.create_index("ix_shared_units_engine_seen", "shared_units", ["engine_id", "last_seen_ts"])
    op.create_table(
        "pending_attributions",
        *_request_key(),
        sa.Column("num_prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("num_cached_tokens", sa.Integer(), nullable=False),
        sa.Column("attention_hit_tokens", sa.Integer(), nullable=False),
        sa.Column("match_stop", sa.JSON(), nullable=False),
        sa.Column("arrival_ts", sa.Float(), nullable=False),
        sa.Column("finished_ts", sa.Float(), nullable=False),
        sa.Column("units", sa.LargeBinary(), nullable=False),
        _engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "epoch", "arrival_index"),
    )
    op.create_table(
        "attributions",
        *_request_key(),
        sa.Column("shared_tokens", sa.Integer(), nullable=False),
        sa.Column("oracle_tokens", sa.Integer(), nullable=False),
        *(sa.Column(f"missed_{reason}", sa.Integer(), nullable=False) for reason in REASONS),
        _engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "epoch", "arrival_index"),
    )


def downgrade() -> None:
    op.drop_table("attributions")
    op.drop_table("pending_attributions")
    op.drop_index("ix_shared_units_engine_seen", table_name="shared_units")
    op.drop_table("shared_units")
    op.drop_table("attribution_salts")
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    for column in reversed(BUCKET_COLUMNS):
        op.drop_column("hit_rate_buckets", column)
    op.drop_column("pins", "source")
    for column in ("match_stop", "oldest_unfinished_index", "arrival_index"):
        op.drop_column("requests", column)
