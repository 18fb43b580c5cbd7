"""`junction worker` and `junction beat`: a Celery worker and the beat scheduler of `jobs.app`,
on the broker of the settings (`JUNCTION_BROKER_URL`, `JUNCTION_RESULT_BACKEND`)."""

from __future__ import annotations

import argparse
import sys

EXIT_BAD_INPUT = 2


def add_jobs_parsers(commands: argparse._SubParsersAction) -> None:
    worker = commands.add_parser(
        "worker",
        help="run a Celery worker for the benchmark jobs",
        description="Run benchmark runs queued by POST /api/v1/benchmarks and the nightly suite "
        "(broker: JUNCTION_BROKER_URL; store: JUNCTION_DATABASE_URL).",
    )
    worker.add_argument(
        "--concurrency", type=int, default=None, help="worker processes (default: CPU count)"
    )
    worker.add_argument("--loglevel", default="info")
    worker.add_argument("--quiet", action="store_true", help="no start-up banner")
    worker.add_argument("-Q", "--queues", default=None, help="comma-separated queues to consume")
    worker.add_argument(
        "--pool", default=None, help="prefork (the default), solo, or threads (Celery's -P)"
    )
    worker.add_argument("-n", "--hostname", default=None, help="the worker's node name")
    worker.set_defaults(func=run_worker)

    beat = commands.add_parser(
        "beat",
        help="run the Celery beat scheduler (nightly standard suite, sweep of lost runs)",
        description="Send the scheduled tasks of jobs.app: the standard suite on "
        "JUNCTION_BENCHMARK_SCHEDULE (a crontab, UTC) and the sweep of lost runs.",
    )
    beat.add_argument("--loglevel", default="info")
    beat.add_argument("--quiet", action="store_true", help="no start-up banner")
    beat.add_argument(
        "--schedule",
        default="celerybeat-schedule",
        help="file where beat keeps when each task last ran",
    )
    beat.set_defaults(func=run_beat)


def worker_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--quiet"] if getattr(args, "quiet", False) else []  # Celery's own, before `worker`
    argv += ["worker", f"--loglevel={args.loglevel}"]
    if args.concurrency is not None:
        argv.append(f"--concurrency={args.concurrency}")
    if args.queues:
        argv.append(f"--queues={args.queues}")
    if args.pool:
        argv.append(f"--pool={args.pool}")
    if args.hostname:
        argv.append(f"--hostname={args.hostname}")
    return argv


def schedule_problem() -> str | None:
    """What is wrong with the beat schedule of the settings, or None; checked before Celery
    starts, which would say it in a long traceback. Bad settings raise pydantic's
    `ValidationError` (said briefly by `cli.main`)."""
    from api.settings import get_settings
    from jobs.app import beat_schedule

    settings = get_settings()  # outside the `try`: a `ValidationError` is a `ValueError`
    try:
        beat_schedule(settings)
    except ValueError as exc:
        return str(exc)
    return None


def run_worker(args: argparse.Namespace) -> int:
    from jobs.app import app

    if problem := schedule_problem():  # the worker's config holds the schedule too
        print(f"junction worker: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    app.worker_main(worker_argv(args))
    return 0


def run_beat(args: argparse.Namespace) -> int:
    from jobs.app import app

    if problem := schedule_problem():
        print(f"junction beat: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    quiet = ["--quiet"] if args.quiet else []  # Celery's own, before `beat`
    app.start([*quiet, "beat", f"--loglevel={args.loglevel}", f"--schedule={args.schedule}"])
    return 0
