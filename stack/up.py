"""`junction up`: settle the API token (`JUNCTION_API_TOKEN`, else the one kept in its file,
made at first start: `api.guards.token`), migrate the embedded store, start the control plane, one
engine (torch runner, CUDA when present) or, with `--engines N`, N engines behind
`junction route`, the dashboard, a Celery worker and beat, each given the token; print the URLs
and where the token is; stream every part's log with its name; start again a part that exits
(`stack.restarts`); stop everything on Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from client.settings_errors import say
from stack.preflight import check_serve_args, engines_problems, serve_model

EXIT_BAD_INPUT = 2


def cmd_up(args: argparse.Namespace) -> int:
    """Check every option and setting, then start the parts, watch them and stop them all;
    the exit code."""
    from api.guards.token import TokenError, resolve_token, where
    from api.settings import get_settings
    from api.store import migrate
    from stack.parts import Ports, environment, plan, shared_cache_url
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
        engine_id=args.engine_id,
        device=args.device,
        with_jobs=not args.no_jobs,
        serve_args=serve_args,
        num_engines=args.engines,
        model=serve_model(serve_args),
        shared_cache=shared_cache_url(
            args.engines, serve_args, settings.database_url, dict(os.environ)
        ),
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
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # `nohup junction up` keeps on
        # its terminal closed: the parts (each in its own session) stopped, not orphaned
        signal.signal(signal.SIGHUP, on_signal)
    code = 0
    try:
        supervisor.start(args.ready_timeout)
        if not supervisor.stopping.is_set():
            print_urls(parts, api_token)
            supervisor.watch()  # until Ctrl-C: a part that exits is started again
    except PartFailed as exc:
        print(f"junction up: {exc}; stopping the rest", file=sys.stderr, flush=True)
        code = 1
    finally:
        supervisor.stop()
    left_down = supervisor.left_down()
    if left_down:  # kept dying (reported when it was left down): the exit code says so
        print(f"junction up: left down: {', '.join(left_down)}", file=sys.stderr, flush=True)
        code = 1
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
