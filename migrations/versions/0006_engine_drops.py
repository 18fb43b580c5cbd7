"""`engines`: what an engine's outbox gave up, as its last snapshot said.

An engine keeps every finished request through an outage, carried by the snapshots that replace
its block batches; past its outbox's stated limits it must drop some, and counts them. The
store keeps the counts (per epoch) so the REST API and the dashboard can say so.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for column in ("num_batches_dropped", "num_requests_dropped"):
        op.add_column(
            "engines", sa.Column(column, sa.BigInteger(), nullable=False, server_default="0")
        )
    op.add_column("engines", sa.Column("last_drop", sa.Text(), nullable=True))


def downgrade() -> None:
    # No batch mode: on SQLite it would copy `engines` and drop the original, and the foreign
    # keys to it would null or delete the pins' rows. SQLite (3.35+) drops columns itself.
    for column in ("last_drop", "num_requests_dropped", "num_batches_dropped"):
        op.drop_column("engines", column)
