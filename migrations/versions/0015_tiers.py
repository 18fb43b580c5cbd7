"""Where a block lives: the tiers below the device (host memory, disk, the shared store).

`tier_units` keeps each engine's usable-hit units in each tier, as its `BlockStored` and
`BlockRemoved` events of medium `host`, `disk` or `shared` said (a removed unit keeps its row,
`removed_ts` set, for miss attribution: evicted from which tier); `request_loads` holds a
request's `UnitLoaded` parts until its `RequestFinished` comes, which then writes
`requests.hit_tokens_by_tier` and `requests.loaded_bytes_by_tier`. `hit_rate_buckets` adds each
tier's loaded tokens and bytes; `attributions` and `hit_rate_buckets` count the misses evicted
from host, disk or the shared store, and those never admitted below the device.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIERS = ("host", "disk", "shared")
REASONS = ("evicted_host", "evicted_disk", "evicted_shared", "not_admitted")
BUCKET_COUNTERS = tuple(f"{t}_hit_tokens" for t in TIERS) + tuple(
    f"{t}_loaded_bytes" for t in TIERS
)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tier_units",
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("unit_key", sa.String(128), nullable=False),
        sa.Column("unit", sa.BigInteger(), nullable=False),
        sa.Column("parent_key", sa.String(128), nullable=True),
        sa.Column("token_start", sa.BigInteger(), nullable=False),
        sa.Column("token_end", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("stored_ts", sa.Float(), nullable=False),
        sa.Column("removed_ts", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("engine_id", "tier", "unit_key"),
    )
    op.create_index("ix_tier_units_engine_unit", "tier_units", ["engine_id", "unit"])
    op.create_table(
        "request_loads",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("tokens_by_tier", sa.JSON(), nullable=False),
        sa.Column("bytes_by_tier", sa.JSON(), nullable=False),
        sa.Column("loaded_ts", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE"),
    )
    op.create_index("ix_request_loads_engine_request", "request_loads", ["engine_id", "request_id"])
    op.add_column("requests", sa.Column("hit_tokens_by_tier", sa.JSON(), nullable=True))
    op.add_column("requests", sa.Column("loaded_bytes_by_tier", sa.JSON(), nullable=True))
    for name in BUCKET_COUNTERS:
        op.add_column(
            "hit_rate_buckets",
            sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"),
        )
    for reason in REASONS:
        op.add_column(
            "attributions",
            sa.Column(f"missed_{reason}", sa.Integer(), nullable=False, server_default="0"),
        )
        op.add_column(
            "hit_rate_buckets",
            sa.Column(f"missed_{reason}", sa.BigInteger(), nullable=False, server_default="0"),
        )


def downgrade() -> None:
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    for reason in REASONS:
        op.drop_column("hit_rate_buckets", f"missed_{reason}")
        op.drop_column("attributions", f"missed_{reason}")
    for name in BUCKET_COUNTERS:
        op.drop_column("hit_rate_buckets", name)
    op.drop_column("requests", "loaded_bytes_by_tier")
    op.drop_column("requests", "hit_tokens_by_tier")
    op.drop_index("ix_request_loads_engine_request", table_name="request_loads")
    op.drop_table("request_loads")
    op.drop_index("ix_tier_units_engine_unit", table_name="tier_units")
    op.drop_table("tier_units")
