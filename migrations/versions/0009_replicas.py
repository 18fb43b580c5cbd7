"""Replicas: several `junction api` processes on one PostgreSQL database.

`replicas` has a row per live process (`api.fleet.replicas`), its heartbeat refreshed every
`JUNCTION_REPLICA_HEARTBEAT_S`; `engines.replica_id` names the replica that holds the engine's
socket and `engines.connection_id` that socket, so "connected" is true fleet-wide and the
newest hello wins wherever the older socket is. `ix_event_batches_received_at` lets the
retention task (`api.retention`) find the batches past their window without a scan.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("replica_id"),
    )
    op.add_column("engines", sa.Column("replica_id", sa.String(64), nullable=True))
    op.add_column("engines", sa.Column("connection_id", sa.String(64), nullable=True))
    op.create_index("ix_event_batches_received_at", "event_batches", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_event_batches_received_at", table_name="event_batches")
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    op.drop_column("engines", "connection_id")
    op.drop_column("engines", "replica_id")
    op.drop_table("replicas")
