"""Misses lost to an engine restart: `restarted` beside `evicted`.

An engine restart is a new epoch whose cache starts empty, so a unit held only in an earlier
epoch was lost to the restart, not evicted (`workloads.misses`). `shared_units` keeps the
latest epoch that held each unit (`last_epoch`) and the earliest finish in that epoch
(`last_epoch_finished_ts`); `attributions` and `hit_rate_buckets` count `missed_restarted`.
The units stored before it are taken as held in their engine's current epoch, so what they
explain stays `evicted`, as it was.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL = (
    "UPDATE shared_units SET last_epoch = (SELECT engines.epoch FROM engines"
    " WHERE engines.engine_id = shared_units.engine_id),"
    " last_epoch_finished_ts = first_finished_ts"
)


def upgrade() -> None:
    op.add_column(
        "attributions",
        sa.Column("missed_restarted", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "hit_rate_buckets",
        sa.Column("missed_restarted", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column(
        "shared_units",
        sa.Column("last_epoch", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column(
        "shared_units",
        sa.Column("last_epoch_finished_ts", sa.Float(), nullable=False, server_default="0"),
    )
    op.execute(BACKFILL)


def downgrade() -> None:
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    op.drop_column("shared_units", "last_epoch_finished_ts")
    op.drop_column("shared_units", "last_epoch")
    op.drop_column("hit_rate_buckets", "missed_restarted")
    op.drop_column("attributions", "missed_restarted")
