"""The `junction up` command line: its options, and the engine options after `--` that it
passes through to `junction serve`. What it runs is `stack.up`."""

from __future__ import annotations

import argparse

from stack.preflight import MAX_ENGINES
from stack.up import cmd_up


def add_up_parser(commands: argparse._SubParsersAction) -> None:
    from engine.runners import RUNNER_NAMES

    parser = commands.add_parser(
        "up",
        help="run the whole stack: control plane, engine, dashboard, worker and beat",
        description="Migrate JUNCTION_DATABASE_URL (default: the SQLite file ./junction.db), "
        "then start `junction api`, `junction serve` streaming to it (--engines N: N of them "
        "behind `junction route`), `junction dashboard`, `junction worker` and `junction beat` "
        "(Celery on JUNCTION_BROKER_URL, by default its SQLAlchemy transport on "
        "./junction-broker.db), all with one JUNCTION_API_TOKEN (unset: "
        "made at first start and kept in JUNCTION_API_TOKEN_FILE, by default "
        "./junction-api-token beside the SQLite store). Ctrl-C stops them all.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address every part listens on")
    parser.add_argument("--api-port", type=int, default=8080)
    parser.add_argument(
        "--engine-port",
        type=int,
        default=8000,
        help="the OpenAI API's port: the engine's, or the router's with --engines N",
    )
    parser.add_argument("--dashboard-port", type=int, default=8501)
    parser.add_argument("--runner", choices=RUNNER_NAMES, default="torch")
    parser.add_argument(
        "--engines",
        type=int,
        default=1,
        metavar="N",
        help=f"how many engines (1 to {MAX_ENGINES}, default 1); N >= 2 start engine-0 ... "
        "engine-<N-1> (with --model, <model>-0 ...) on the N ports after --engine-port and "
        "`junction route` in front of them on --engine-port",
    )
    parser.add_argument(
        "--engine-id",
        default=None,
        help="the one engine's id (--engines 1; default engine-0, or with --model the "
        "checkpoint directory's name, e.g. bamba-9b)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="the engine's Hugging Face-format checkpoint directory (default: the built-in "
        "model of random weights); `junction serve --model`",
    )
    parser.add_argument("--no-jobs", action="store_true", help="no Celery worker or beat")
    parser.add_argument(
        "--ready-timeout", type=float, default=180, help="seconds each part may take to start"
    )
    parser.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        metavar="-- SERVE OPTIONS",
        help="options after `--` go to the engine's `junction serve` (cache options, --weights, "
        "...), e.g. `junction up -- --block-size 64 --no-junction-checkpoints`",
    )
    parser.set_defaults(func=cmd_up)
