"""The `junction` command line: one parser gathering each package's subcommands.

Every package offers its own through an `add_*_parser(commands)` function, imported here and
nowhere else, so no package needs one above it: the engine (`replay`, `whatif`, `serve`, `attach`,
`bench`), the control plane (`api`, `migrate`, `pin`, `unpin`, `pins`), the jobs (`worker`,
`beat`), the dashboard and the stack (`up`). Each command loads its heavy libraries only when
it runs. Settings the environment gets wrong are said one line each (`client.settings_errors`),
exit 2; so is an option the command does not know, with the command's closest ones.
"""

from __future__ import annotations

import argparse
import sys

from api.cli import add_api_parser
from attach.cli import add_attach_parser
from bench.cli import add_bench_parser
from client.pins_cli import add_pin_parsers
from client.whatif_cli import add_whatif_parser
from dashboard.cli import add_dashboard_parser
from engine.setup.argv import unknown_options
from jobs.cli import add_jobs_parsers
from router.cli import add_route_parser
from serve.cli import add_serve_parser
from serve.replay_cli import add_replay_parser
from stack.cli import add_up_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="junction",
        description="Prefix-cache engine and control plane for hybrid attention + Mamba models.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    # the order of `junction --help`
    add_replay_parser(commands)
    add_whatif_parser(commands)
    add_serve_parser(commands)
    add_attach_parser(commands)
    add_route_parser(commands)
    add_api_parser(commands)
    add_pin_parsers(commands)
    add_bench_parser(commands)
    add_jobs_parsers(commands)
    add_dashboard_parser(commands)
    add_up_parser(commands)
    return parser


def command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the subcommand `args` chose (`junction serve`'s, `junction attach
    vllm`'s, ...)."""
    while True:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not found or getattr(args, found[0].dest, None) not in found[0].choices:
            return parser
        parser = found[0].choices[getattr(args, found[0].dest)]


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but what a subcommand does not know is said by the subcommand
    in one line, with the options it meant (argparse says the top-level usage), exit 2."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = command_parser(parser, args)
        sub.exit(2, f"{sub.prog}: {unknown_options(sub, extras)}; see `{sub.prog} --help`\n")
    return args


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from client.settings_errors import EXIT_BAD_SETTINGS, describe, is_settings_error, say

    args = None
    try:  # the parser too: some options take their defaults from the settings
        args = parse(build_parser(), argv)
        return args.func(args)
    except ValidationError as exc:  # the settings refused the environment: say which, briefly
        if not is_settings_error(exc):
            raise
        say(args.command if args else "", describe(exc))
        return EXIT_BAD_SETTINGS


if __name__ == "__main__":
    sys.exit(main())
