"""`dead_letters`: frames the store refused, parked so an engine's stream goes on.

A frame that decodes but that the store cannot apply for a reason retrying will not fix (a
constraint, a value beyond its column, an index row over PostgreSQL's limit) used to close the
socket, again at every resend: one such frame stopped an engine's stream for good. Now it is
kept here with the reason, its seq counts as applied, and the stream goes on
(`api.ingest.dead_letters`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("frame_type", sa.String(16), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("frame", sa.Text(), nullable=False),
        sa.Column("frame_bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_dead_letters_engine_id", "dead_letters", ["engine_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_dead_letters_engine_id", table_name="dead_letters")
    op.drop_table("dead_letters")
