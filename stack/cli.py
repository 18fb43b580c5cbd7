"""`junction up`: settle the API token (`JUNCTION_API_TOKEN`, else the one kept in its file,
made at first start: `api.guards.token`), migrate the embedded store, start the control plane, one
engine (torch runner, CUDA when present) or, with `--engines N`, N engines behind
`junction route`, the dashboard, a Celery worker and beat, each given the token; print the URLs
and where the token is; stream every part's log with its name; stop everything on Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys

from client.settings_errors import say

EXIT_BAD_INPUT = 2
MAX_ENGINES = 16


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
        "engine-<N-1> on the N ports after --engine-port and `junction route` in front of them "
        "on --engine-port",
    )
    parser.add_argument(
        "--engine-id", default=None, help="the one engine's id (default engine-0; --engines 1)"
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


def check_serve_args(serve_args: list[str], model: str | None = None) -> tuple[str, ...]:
    """The pass-through options, with `--model` first when given, checked by `junction
    serve`'s own parser (and the configs they make: the model directory, the cache geometry)
    before anything starts; raises `ValueError` with the reason."""
    from engine.options import configs_from_args

    args = serve_args[1:] if serve_args[:1] == ["--"] else serve_args
    args = ["--model", model, *args] if model is not None else args
    if not args:
        return ()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parsed = _parse_serve(args)
    except SystemExit:
        reason = (said.getvalue().strip().splitlines() or ["not accepted"])[-1]
        raise ValueError(f"engine options {' '.join(args)!r}: {reason}") from None
    try:
        configs_from_args(parsed)
    except ValueError as exc:
        raise ValueError(f"engine options {' '.join(args)!r}: {exc}") from None
    return tuple(args)


def serve_model(serve_args: tuple[str, ...]) -> str | None:
    """The `--model` of checked pass-through options (`check_serve_args`), None when none."""
    return _parse_serve(list(serve_args)).model if serve_args else None


def _parse_serve(args: list[str]) -> argparse.Namespace:
    """`args` as `junction serve` parses them (argparse's `SystemExit` when it refuses)."""
    from engine.server.cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="junction")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *args])


def engines_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with `--engines` (and the options it bears on), one line each."""
    if not 1 <= args.engines <= MAX_ENGINES:
        return [f"--engines must be 1 to {MAX_ENGINES}, got {args.engines}"]
    problems = []
    if args.engines > 1 and args.engine_id is not None:
        problems.append(
            f"--engine-id names the one engine; the {args.engines} engines of --engines "
            f"{args.engines} are engine-0 ... engine-{args.engines - 1}"
        )
    if args.engine_port + args.engines > 65535:
        problems.append(
            f"--engine-port {args.engine_port} leaves no room for {args.engines} engines on "
            "the ports after it"
        )
    return problems


def cmd_up(args: argparse.Namespace) -> int:
    from api.guards.token import TokenError, resolve_token, where
    from api.settings import get_settings
    from api.store import migrate
    from stack.parts import Ports, environment, plan
    from stack.settings_check import settings_problems
    from stack.supervisor import PartFailed, PortTaken, Supervisor, check_ports

    problems = settings_problems(with_jobs=not args.no_jobs) + engines_problems(args)
    try:
        serve_args = check_serve_args(args.serve_args, args.model)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:  # every part's, in one message, before anything starts
        say("up", problems)
        return EXIT_BAD_INPUT
    settings = get_settings()
    try:
        api_token = resolve_token(settings)
    except TokenError as exc:
        print(f"junction up: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ports = Ports(args.api_port, args.engine_port, args.dashboard_port)
    parts = plan(
        args.host,
        ports,
        runner=args.runner,
        engine_id=args.engine_id or "engine-0",
        device=args.device,
        with_jobs=not args.no_jobs,
        serve_args=serve_args,
        num_engines=args.engines,
        model=serve_model(serve_args),
    )
    try:
        check_ports(args.host, parts)
    except PortTaken as exc:
        print(f"junction up: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"junction up: {where(api_token)}", flush=True)
    print(f"junction up: migrating the store at {settings.database_url}", flush=True)
    try:
        migrate.upgrade(settings.database_url)
    except Exception as exc:
        print(f"junction up: could not migrate {settings.database_url}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    supervisor = Supervisor(parts, environment(args.host, ports, api_token.token))

    def on_signal(signum: int, _frame) -> None:
        supervisor.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        supervisor.start(args.ready_timeout)
        if not supervisor.stopping.is_set():
            print_urls(parts, api_token)
            died = supervisor.watch()
            if died:
                print(f"junction up: {died}; stopping the rest", file=sys.stderr, flush=True)
                code = 1
    except PartFailed as exc:
        print(f"junction up: {exc}; stopping the rest", file=sys.stderr, flush=True)
        code = 1
    finally:
        supervisor.stop()
    print("junction up: every part stopped", flush=True)
    return code


def print_urls(parts, api_token) -> None:
    lines = ["", "Junction is up:"]
    num_engines = sum(part.name.startswith("engine") for part in parts)
    for part in parts:
        if part.url:
            routed = f" (routes over the {num_engines} engines)" if part.name == "router" else ""
            lines.append(f"  {part.name:<10} {part.url}{routed}")
    if any(part.name == "worker" for part in parts):
        lines.append(f"  {'worker':<10} Celery worker and beat (benchmark jobs)")
    kept = api_token.file.resolve() if api_token.file else "JUNCTION_API_TOKEN"
    lines.append(f"  {'API token':<10} {kept} (send it as Authorization: Bearer <token>)")
    lines.append("Ctrl-C stops everything.")
    print("\n".join(lines) + "\n", flush=True)
