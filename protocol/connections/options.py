"""The command-line flags of `junction route` and `junction serve` for `ConnectionBounds`,
each defaulting to the `JUNCTION_*` variable `junction api` reads for the same bound."""

from __future__ import annotations

import argparse
import os

from protocol.connections.bounds import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IDLE_CONNECTIONS,
    DEFAULT_MAX_IDLE_CONNECTIONS_PER_IP,
    ConnectionBounds,
)

#: flag -> (its environment variable, default, type, help)
FLAGS = {
    "--header-timeout": (
        "JUNCTION_HEADER_TIMEOUT_S",
        DEFAULT_HEADER_TIMEOUT_S,
        float,
        "seconds a connection may take to send a request's headers; then it is answered 408 "
        "and closed",
    ),
    "--max-connections": (
        "JUNCTION_MAX_CONNECTIONS",
        DEFAULT_MAX_CONNECTIONS,
        int,
        "connections at once (lowered to what ulimit -n leaves); one more closes an idle one, "
        "or is answered 503 when none is idle",
    ),
    "--max-idle-connections": (
        "JUNCTION_MAX_IDLE_CONNECTIONS",
        DEFAULT_MAX_IDLE_CONNECTIONS,
        int,
        "connections that sent no request yet, in all; one more closes the oldest (503)",
    ),
    "--max-idle-connections-per-ip": (
        "JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP",
        DEFAULT_MAX_IDLE_CONNECTIONS_PER_IP,
        int,
        "connections of one client IP that sent no request yet; one more closes its oldest (503)",
    ),
}


def checked(flag: str, env: str, kind: type) -> object:
    """argparse's type for `flag`: `kind`, or an error naming the flag and its variable."""

    def convert(value: str) -> float | int:
        try:
            return kind(value)
        except ValueError:
            what = "a number of seconds" if kind is float else "a whole number"
            raise argparse.ArgumentTypeError(
                f"{value!r} is not {what} (set {flag} or {env} to one above 0)"
            ) from None

    return convert


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    for flag, (env, default, kind, text) in FLAGS.items():
        parser.add_argument(
            flag,
            type=checked(flag, env, kind),
            default=os.environ.get(env, str(default)),  # argparse checks it as it does a flag
            metavar="SECONDS" if kind is float else "NUM",
            help=f"{text} (default {default:g}; {env})",
        )


def bounds_from_args(args: argparse.Namespace) -> ConnectionBounds:
    """The bounds the flags give; `ValueError` naming the flag and its variable."""
    try:
        return ConnectionBounds(
            header_timeout_s=args.header_timeout,
            max_connections=args.max_connections,
            max_idle=args.max_idle_connections,
            max_idle_per_ip=args.max_idle_connections_per_ip,
        )
    except ValueError as exc:
        flag = next(flag for flag, (env, *_) in FLAGS.items() if str(exc).startswith(env))
        raise ValueError(f"{flag}: {exc}") from None
