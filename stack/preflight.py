"""What `junction up` checks in its own options before it starts anything: `--engines` and the
options it bears on, and the options after `--`, read by `junction serve`'s own parser. (The
settings are `stack.settings_check`'s to check, the ports `stack.supervisor.check_ports`'.)"""

from __future__ import annotations

import argparse
import contextlib
import io

from stack.engine_ids import engine_ids

MAX_ENGINES = 16


def engines_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with `--engines` (and the options it bears on), one line each."""
    if not 1 <= args.engines <= MAX_ENGINES:
        return [f"--engines must be 1 to {MAX_ENGINES}, got {args.engines}"]
    problems = []
    if args.engine_id is not None:
        try:
            engine_ids(1, None, args.engine_id)
        except ValueError as exc:
            problems.append(f"--engine-id: {exc}")
    if args.engines > 1 and args.engine_id is not None:
        ids = engine_ids(args.engines, args.model)
        problems.append(
            f"--engine-id names the one engine; the {args.engines} engines of --engines "
            f"{args.engines} are {ids[0]} ... {ids[-1]}"
        )
    if args.engine_port + args.engines > 65535:
        problems.append(
            f"--engine-port {args.engine_port} leaves no room for {args.engines} engines on "
            "the ports after it"
        )
    return problems


def check_serve_args(serve_args: list[str], model: str | None = None) -> tuple[str, ...]:
    """The pass-through options, with `--model` first when given, checked by `junction
    serve`'s own parser (and the configs they make: the model directory, the cache geometry)
    before anything starts; raises `ValueError` with the reason."""
    from engine.setup.options import configs_from_args

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
    """`args` as `junction serve` parses them (argparse's `SystemExit` when it refuses, an
    unknown option said with the options it may have meant)."""
    from engine.setup.argv import unknown_options
    from serve.cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="junction")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    parsed, extras = parser.parse_known_args(["serve", *args])
    if extras:
        serve = commands.choices["serve"]
        serve.error(unknown_options(serve, extras))
    return parsed
