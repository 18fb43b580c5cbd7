"""`junction worker` and `junction beat`: a Celery worker and the beat scheduler of `jobs.app`,
on the broker of the settings (`JUNCTION_BROKER_URL`, `JUNCTION_RESULT_BACKEND`)."""

from __future__ import annotations

import argparse


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
    beat.add_argument(
        "--schedule",
        default="celerybeat-schedule",
        help="file where beat keeps when each task last ran",
    )
    beat.set_defaults(func=run_beat)


def worker_argv(args: argparse.Namespace) -> list[str]:
    argv = ["worker", f"--loglevel={args.loglevel}"]
    if args.concurrency is not None:
        argv.append(f"--concurrency={args.concurrency}")
    if args.queues:
        argv.append(f"--queues={args.queues}")
    if args.pool:
        argv.append(f"--pool={args.pool}")
    if args.hostname:
        argv.append(f"--hostname={args.hostname}")
    return argv


def run_worker(args: argparse.Namespace) -> int:
    from jobs.app import app

    app.worker_main(worker_argv(args))
    return 0


def run_beat(args: argparse.Namespace) -> int:
    from jobs.app import app

    app.start(["beat", f"--loglevel={args.loglevel}", f"--schedule={args.schedule}"])
    return 0
