"""Where an engine command's cache events go: the control-plane options of `replay` and
`serve`, the publisher they build, the command queue it feeds, and the last flush.

The publisher streams over a websocket and reads the client settings, so this lives above the
engine and `client/`; the core's commands would otherwise have to reach up for it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from client.settings import ControlPlaneSettings
from publish.outbox import DEFAULT_MAX_BATCHES, DEFAULT_MAX_BYTES


def add_control_plane_options(parser: argparse.ArgumentParser) -> None:
    """Where `replay` and `serve` stream their cache events, and as which engine."""
    settings = ControlPlaneSettings()
    parser.add_argument("--engine-id", default="engine-0", help="this engine's id in events")
    parser.add_argument(
        "--control-plane",
        default=settings.control_plane_url,
        help="control plane URL to stream cache events to (env JUNCTION_CONTROL_PLANE_URL)",
    )
    parser.add_argument(
        "--token",
        default=settings.api_token,
        help="bearer token for the control plane (env JUNCTION_API_TOKEN)",
    )
    parser.add_argument(
        "--outbox-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="the most encoded event bytes held for the control plane while it is away; past "
        "it the block events give way to a snapshot, finished requests are kept (default "
        f"{DEFAULT_MAX_BYTES // 2**20} MiB, three quarters of it for finished requests)",
    )
    parser.add_argument(
        "--outbox-batches",
        type=int,
        default=DEFAULT_MAX_BATCHES,
        metavar="NUM",
        help="the most event batches held for the control plane while it is away (default "
        f"{DEFAULT_MAX_BATCHES}); past it they give way to a snapshot likewise",
    )


def make_publisher(args: argparse.Namespace, model: dict):
    """An `EventPublisher` to `--control-plane` (not yet attached) whose hello carries `model`
    (the model card), or None and a message when the options are wrong. Imported here, so a
    command without a control plane stays web-free."""
    from publish.publisher import EventPublisher

    if not args.token:
        print(
            f"junction {args.command}: --control-plane needs --token (or JUNCTION_API_TOKEN)",
            file=sys.stderr,
        )
        return None
    for option, value in (
        ("--outbox-bytes", args.outbox_bytes),
        ("--outbox-batches", args.outbox_batches),
    ):
        if value < 1:
            print(
                f"junction {args.command}: {option} must be a positive number, got {value}",
                file=sys.stderr,
            )
            return None
    try:
        publisher = EventPublisher(
            args.control_plane,
            args.token,
            model=model,
            max_bytes=args.outbox_bytes,
            max_batches=args.outbox_batches,
        )
    except ValueError as exc:
        print(f"junction {args.command}: {exc}", file=sys.stderr)
        return None
    return publisher


def connect(
    publisher, engine, tokenizer, wake: Callable | None = None, call_on_engine=None
) -> None:
    """Stream `engine`'s events through `publisher`, and apply the control plane's commands on
    the engine's thread, a pin's messages rendered by `tokenizer` (`wake` rouses an idle
    engine loop; `call_on_engine` runs a call on it, for an engine whose steps run on a thread
    of their own)."""
    from publish.commands import CommandQueue

    commands = CommandQueue(wake=wake, tokenizer=tokenizer)
    commands.attach(engine)
    publisher.on_command = commands.on_command
    publisher.attach(engine, call_on_engine=call_on_engine)


def finish_publishing(publisher, command: str, timeout_s: float, quiet: bool = False) -> bool:
    """Wait (up to `timeout_s`) for the control plane to acknowledge every event, then stop
    streaming; warns on stderr, naming the command, when some were not. True when all were."""
    try:
        if not quiet:
            print(
                f"junction {command}: waiting up to {timeout_s:g}s for the control plane to "
                f"acknowledge {publisher.stats().num_buffered} event frames",
                file=sys.stderr,
            )
        if publisher.flush(timeout_s):
            if not quiet:
                print(f"junction {command}: the control plane has every event", file=sys.stderr)
            return True
        stats = publisher.stats()
        print(
            f"junction {command}: warning: {stats.num_buffered} event frames were not "
            f"acknowledged by the control plane at {publisher.url} within {timeout_s:g}s (last "
            f"error: {stats.last_error or 'none'}); its block table is behind this engine",
            file=sys.stderr,
        )
        return False
    finally:
        publisher.close()
