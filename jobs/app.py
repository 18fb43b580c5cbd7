"""The Celery app of the benchmark jobs: broker and result backend from the settings, UTC, and
the beat schedule (the standard suite on `benchmark_schedule`, the sweep of lost runs).

Run it with `junction worker` and `junction beat` (`jobs.cli`). The configuration is read from
`get_settings()` when first needed, not at import. The broker is Redis in compose and CI, and
on the embedded default Celery's SQLAlchemy transport on a SQLite file (`sqla+sqlite:///...`,
with `db+sqlite:///...` results). The tasks live in `jobs.tasks`; the API sends them by name
(`api.runs.broker.send_run`), so it imports neither the tasks nor the engine, and the transport
options and the run task's name are the API's (`api.runs.broker`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.schedules import crontab

from api.runs.broker import transport_options
from api.settings import Settings, get_settings

TASK_SUITE = "junction.enqueue_suite"
TASK_SWEEP = "junction.sweep_stale_runs"
#: How often beat sweeps running runs whose worker stopped heartbeating.
SWEEP_EVERY_S = 300.0


def parse_crontab(spec: str) -> crontab:
    """`"minute hour day-of-month month day-of-week"` (as cron) as a Celery crontab, in UTC;
    raises `ValueError` naming `JUNCTION_BENCHMARK_SCHEDULE`, the spec and what is wrong.
    `junction worker`, `beat` and `up` check the setting with it before they start."""
    fields = spec.split()
    if len(fields) != 5:
        raise ValueError(
            f"JUNCTION_BENCHMARK_SCHEDULE={spec!r}: must have 5 crontab fields "
            f"(minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    try:
        return crontab(minute, hour, day_of_week, day_of_month, month_of_year)
    except ValueError as exc:
        raise ValueError(
            f"JUNCTION_BENCHMARK_SCHEDULE={spec!r}: not a valid crontab "
            f"(minute hour day-of-month month day-of-week): {exc}"
        ) from None


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    return {
        "standard-suite": {
            "task": TASK_SUITE,
            "schedule": parse_crontab(settings.benchmark_schedule),
        },
        "sweep-stale-runs": {"task": TASK_SWEEP, "schedule": SWEEP_EVERY_S},
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "broker_transport_options": transport_options(settings.broker_url),
        "broker_connection_retry_on_startup": True,
        "timezone": "UTC",
        "enable_utc": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        # a run is acked once it ends; a worker that dies mid-run leaves its message
        # to another (with `reject_on_worker_lost` on the run task)
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "result_expires": 7 * 24 * 3600,
        "beat_schedule": beat_schedule(settings),
    }


app = Celery("junction", include=["jobs.tasks"])
app.add_defaults(lambda: celery_config(get_settings()))
