"""The write token replicas on one database share.

`junction api` without `JUNCTION_API_TOKEN` made a token in a file in its working directory, so
replicas started in different directories made different tokens and half the clients failed
(issue 31). On a database other than SQLite the first replica's token is kept in `api_secrets`
and every later one takes it (`api.guards.shared_token`).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("api_secrets")
