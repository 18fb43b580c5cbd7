"""Operator pins with a target row per engine; what requests record for pins and junctions.

`pins` becomes the operator's pin (label, prefix tokens, priority, targets); the engine's side
of it (state, boundary, keys, block ids) moves to `pin_targets`, one row per (pin, engine).
Pins the store already held were reported by engines: they become `origin = 'engine'` pins
with one target row each. `requests` gains `pin_hits`, `attention_match_key` and
`junction_token_ids`. The downgrade folds each pin's latest target back into its row.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
NULLABLE_JSON = sa.JSON(none_as_null=True)
FK_TARGET_PIN = "fk_pin_targets_pin_id_pins"


def upgrade() -> None:
    op.add_column("requests", sa.Column("pin_hits", sa.JSON(), server_default="{}", nullable=False))
    op.add_column("requests", sa.Column("attention_match_key", sa.String(128), nullable=True))
    op.add_column("requests", sa.Column("junction_token_ids", NULLABLE_JSON, nullable=True))
    op.create_index("ix_requests_attention_match_key", "requests", ["attention_match_key"])

    # the targets first, filled from the old rows; their link to `pins` once that is rebuilt
    # (SQLite rebuilds a table by dropping it, which would cascade to a linked table)
    op.create_table(
        "pin_targets",
        sa.Column("pin_id", sa.Text(), nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("boundary", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("keys", sa.JSON(), nullable=False),
        sa.Column("block_ids", sa.JSON(), nullable=False),
        sa.Column("is_held", sa.Boolean(), nullable=False),
        sa.Column("num_hits", sa.BigInteger(), nullable=False),
        sa.Column("tokens_saved", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("pin_id", "engine_id"),
    )
    op.execute(
        "INSERT INTO pin_targets (pin_id, engine_id, boundary, state, reason, keys, block_ids, "
        "is_held, num_hits, tokens_saved, updated_at) "
        "SELECT pin_id, engine_id, boundary, state, reason, keys, block_ids, "
        "state IN ('pending', 'materialized'), 0, 0, updated_at "
        "FROM pins WHERE engine_id IS NOT NULL"
    )
    with op.batch_alter_table("pins") as batch:
        batch.add_column(sa.Column("label", sa.Text(), nullable=True))
        batch.add_column(sa.Column("origin", sa.String(16), nullable=True))
        batch.add_column(sa.Column("token_ids", NULLABLE_JSON, nullable=True))
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("target_mode", sa.String(8), nullable=True))
        batch.add_column(sa.Column("created_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("released_at", TIMESTAMP, nullable=True))
    op.execute(
        "UPDATE pins SET label = pin_id, origin = 'engine', priority = 0, target_mode = 'list', "
        "num_tokens = COALESCE(num_tokens, boundary, 0), created_at = updated_at, "
        "released_at = CASE WHEN state = 'released' THEN updated_at END"
    )
    with op.batch_alter_table("pins") as batch:
        for name in ("engine_id", "state", "boundary", "keys", "block_ids", "reason"):
            batch.drop_column(name)
        batch.drop_column("updated_at")
        for name in ("label", "origin", "priority", "target_mode", "created_at", "num_tokens"):
            batch.alter_column(name, nullable=False)
    with op.batch_alter_table("pin_targets") as batch:
        batch.create_foreign_key(FK_TARGET_PIN, "pins", ["pin_id"], ["pin_id"], ondelete="CASCADE")


def downgrade() -> None:
    with op.batch_alter_table("pins") as batch:
        batch.add_column(sa.Column("engine_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("state", sa.String(16), nullable=True))
        batch.add_column(sa.Column("boundary", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("keys", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("block_ids", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("updated_at", TIMESTAMP, nullable=True))
    latest = (
        "(SELECT t.{column} FROM pin_targets t WHERE t.pin_id = pins.pin_id "
        "ORDER BY t.updated_at DESC, t.engine_id LIMIT 1)"
    )
    columns = ("engine_id", "state", "boundary", "keys", "block_ids", "reason", "updated_at")
    op.execute("UPDATE pins SET " + ", ".join(f"{c} = {latest.format(column=c)}" for c in columns))
    op.execute(
        "UPDATE pins SET state = CASE WHEN released_at IS NULL THEN 'pending' "
        "ELSE 'released' END WHERE state IS NULL"
    )
    op.execute(
        "UPDATE pins SET state = 'released' WHERE released_at IS NOT NULL "
        "AND state IN ('pending', 'materialized')"
    )
    op.execute("UPDATE pins SET keys = '{}' WHERE keys IS NULL")
    op.execute("UPDATE pins SET block_ids = '{}' WHERE block_ids IS NULL")
    op.execute(
        "UPDATE pins SET updated_at = COALESCE(released_at, created_at) WHERE updated_at IS NULL"
    )
    op.drop_table("pin_targets")
    with op.batch_alter_table("pins") as batch:
        for name in ("label", "origin", "token_ids", "priority", "target_mode", "created_at"):
            batch.drop_column(name)
        batch.drop_column("released_at")
        for name in ("state", "keys", "block_ids", "updated_at"):
            batch.alter_column(name, nullable=False)
        batch.alter_column("num_tokens", nullable=True)
        batch.create_foreign_key(
            "pins_engine_id_fkey", "engines", ["engine_id"], ["engine_id"], ondelete="SET NULL"
        )

    op.drop_index("ix_requests_attention_match_key", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("junction_token_ids")
        batch.drop_column("attention_match_key")
        batch.drop_column("pin_hits")
