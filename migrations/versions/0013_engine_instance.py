"""An engine id's lease: `engines.instance_id` names the engine process (random per start,
sent in its hello) that holds the id; another process's hello is refused while the lease
holds (`api.ingest.lease`).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("engines", sa.Column("instance_id", sa.String(64), nullable=True))


def downgrade() -> None:
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    op.drop_column("engines", "instance_id")
