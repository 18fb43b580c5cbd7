"""What-if replays: each finished request's salted chain, and the replays run over them.

`request_chains` keeps, per engine, epoch and arrival index, a finished request's (or a
queued pin prefill's) salted unit chain of prompt and output, its lengths, its hit, its
arrival step and its chat messages' ends: what `api.whatif.recording` replays. Salted as
`shared_units` is, bounded by `JUNCTION_WHATIF_MAX_REQUESTS` and the attribution window, never
served; `requests` keeps each request's `arrival_step` and `checkpoint_offsets` too (the
event's new fields, served with it). `whatif_runs` holds each replay queued by
`POST /api/v1/engines/{id}/whatif`: its settings, status, progress and report.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
CHAINS_INDEX = "ix_request_chains_engine_finished"
RUNS_BY_ENGINE = "ix_whatif_runs_engine_created"
RUNS_BY_STATUS = "ix_whatif_runs_status_finished"


def _engine_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["engine_id"], ["engines.engine_id"], ondelete="CASCADE")


def upgrade() -> None:
    op.add_column("requests", sa.Column("arrival_step", sa.BigInteger(), nullable=True))
    op.add_column(
        "requests", sa.Column("checkpoint_offsets", sa.JSON(none_as_null=True), nullable=True)
    )
    op.create_table(
        "request_chains",
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("arrival_index", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("num_prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("num_output_tokens", sa.Integer(), nullable=False),
        sa.Column("num_cached_tokens", sa.Integer(), nullable=False),
        sa.Column("arrival_step", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint_offsets", sa.JSON(), nullable=False),
        sa.Column("pin", sa.Boolean(), nullable=False),
        sa.Column("units", sa.LargeBinary(), nullable=False),
        sa.Column("finished_ts", sa.Float(), nullable=False),
        _engine_fk(),
        sa.PrimaryKeyConstraint("engine_id", "epoch", "arrival_index"),
    )
    op.create_index(CHAINS_INDEX, "request_chains", ["engine_id", "finished_ts"])
    op.create_table(
        "whatif_runs",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("progress_done", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("progress_total", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.Column("worker", sa.Text(), nullable=True),
        _engine_fk(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(RUNS_BY_ENGINE, "whatif_runs", ["engine_id", "created_at"])
    op.create_index(RUNS_BY_STATUS, "whatif_runs", ["status", "finished_at"])


def downgrade() -> None:
    op.drop_index(RUNS_BY_STATUS, table_name="whatif_runs")
    op.drop_index(RUNS_BY_ENGINE, table_name="whatif_runs")
    op.drop_table("whatif_runs")
    op.drop_index(CHAINS_INDEX, table_name="request_chains")
    op.drop_table("request_chains")
    # No batch mode (see 0006): SQLite (3.35+) drops columns itself.
    op.drop_column("requests", "checkpoint_offsets")
    op.drop_column("requests", "arrival_step")
