"""A pin's chain names its pin (`request_chains.pin_id`), so a what-if that cannot place it
under some setting says which pin, by the label its user gave it (`api.whatif.recording`).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("request_chains", sa.Column("pin_id", sa.Text(), nullable=True))


def downgrade() -> None:
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    op.drop_column("request_chains", "pin_id")
