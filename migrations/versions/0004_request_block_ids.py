"""`requests.block_ids`: each group's block table when the request finished.

`RequestFinished` now carries the request's block ids per group (read before they are freed),
so the dashboard can outline a request's blocks in the block table. Older rows get `{}`.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "requests", sa.Column("block_ids", sa.JSON(), server_default="{}", nullable=False)
    )


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("block_ids")
