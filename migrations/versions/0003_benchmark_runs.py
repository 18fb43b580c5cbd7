"""Benchmark runs as Celery jobs: a name, the spec, progress, timings, the error, the task.

`benchmark_runs.params` becomes `spec` (the `BenchmarkSpec` JSON the run replays); the run
gains its `name`, its `progress` (0..1) and `progress_message`, `started_at`, `finished_at`,
`heartbeat_at` (the worker's last word: progress or start; the stale-run sweep reads it),
`error` (why it failed), `attempts`, the Celery `task_id` and the `worker` that ran it.
Listing is newest first, optionally by status: an index on (status, created_at).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
INDEX = "ix_benchmark_runs_status_created"


def upgrade() -> None:
    with op.batch_alter_table("benchmark_runs") as batch:
        batch.alter_column("params", new_column_name="spec", existing_type=sa.JSON())
        batch.add_column(sa.Column("name", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("progress", sa.Float(), server_default="0", nullable=False))
        batch.add_column(sa.Column("progress_message", sa.Text(), nullable=True))
        batch.add_column(sa.Column("started_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("finished_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("heartbeat_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("task_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("worker", sa.Text(), nullable=True))
    op.create_index(INDEX, "benchmark_runs", ["status", "created_at"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="benchmark_runs")
    with op.batch_alter_table("benchmark_runs") as batch:
        for name in ("worker", "task_id", "attempts", "error", "heartbeat_at", "finished_at"):
            batch.drop_column(name)
        for name in ("started_at", "progress_message", "progress", "name"):
            batch.drop_column(name)
        batch.alter_column("spec", new_column_name="params", existing_type=sa.JSON())
