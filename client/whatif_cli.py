"""`junction whatif`: what other settings would have hit on the same traffic, from hashes alone.

    junction whatif --trace TRACE [cache options] [--concurrency N] [--try key=value,...]...
    junction whatif --recording FILE [--try ...] [--curve]
    junction whatif --engine ID [--epoch N] [--try ...]   # the control plane's recording

A trace or a recording replays here (`whatif.cli`); an engine's recorded traffic stays
in the control plane's store, which replays it on its worker (`POST /api/v1/engines/{id}/
whatif`): this command queues the run, follows its progress and prints its report. The URL and
token are `junction pin`'s (`--control-plane`, `--token`, `client.settings`).
"""

from __future__ import annotations

import argparse
import sys
import time

from client.pins_cli import CliError, client
from client.rest import ApiError
from client.schema import ATTENTION, DEFAULT_EVICTION, MAMBA
from engine.setup.options import EXIT_BAD_INPUT, add_cache_options, add_model_options
from whatif.cli import cmd_whatif, parse_try, setting_keys

EXIT_FAILED = 1
POLL_S = 0.5


def add_whatif_parser(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "whatif", help="what other settings would have hit on the same traffic, hashes only"
    )
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="a replay trace: run it once with the cache options")
    source.add_argument(
        "--recording", help="a recording's JSON lines (--recording-out, or junction attach's)"
    )
    source.add_argument(
        "--engine", metavar="ID", help="an engine's traffic in the control plane's store"
    )
    add_cache_options(cmd)
    add_model_options(cmd)
    cmd.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="--trace: requests in flight, as `junction replay --concurrency` (default 1)",
    )
    cmd.add_argument(
        "--try",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="a setting to try (keys: " + ", ".join(setting_keys()) + "); repeat for more",
    )
    cmd.add_argument(
        "--curve",
        action="store_true",
        help="also the hit rate against memory: the exact LRU curve (one pass) and the "
        "policy that ran, by sampled replays (--curve-rate)",
    )
    cmd.add_argument(
        "--curve-rate",
        type=float,
        default=0.25,
        metavar="R",
        help="the share of prefix families each curve replay keeps (1: full replays)",
    )
    _add_tier_options(cmd)
    cmd.add_argument(
        "--max-bytes",
        type=int,
        default=None,
        help="the most bytes the replay may hold, estimated before it starts (default: "
        "$JUNCTION_WHATIF_MAX_BYTES, else 2 GiB)",
    )
    cmd.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="the most seconds it may take: refused when estimated over, stopped past it "
        "(default: $JUNCTION_WHATIF_MAX_SECONDS, else 1800)",
    )
    cmd.add_argument("--json", help="write the report here as JSON")
    cmd.add_argument("--recording-out", help="write the recording here (JSON lines)")
    cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    remote = cmd.add_argument_group("--engine: the control plane")
    remote.add_argument("--epoch", type=int, default=None, help="(default: the newest recorded)")
    remote.add_argument("--control-plane", default=None, metavar="URL")
    remote.add_argument("--token", default=None, help="(default: $JUNCTION_API_TOKEN)")
    cmd.set_defaults(func=_whatif, cli_name="whatif")


def _add_tier_options(cmd: argparse.ArgumentParser) -> None:
    """`--tier-curve` and what it is drawn with."""
    cmd.add_argument(
        "--tier-curve",
        choices=("host", "disk"),
        default=None,
        help="also the hit rate against this tier's size (host memory or disk), the device "
        "pools as ran and the other tier none, by exact replays",
    )
    cmd.add_argument(
        "--tier-sizes",
        default=None,
        metavar="BYTES[,BYTES]",
        help="--tier-curve: the tier sizes in bytes (default: 0 and 1/2 to 64 times the "
        "bytes the device pools hold)",
    )
    cmd.add_argument(
        "--unit-bytes",
        default=None,
        metavar="TOKEN,STATE",
        help="--tier-curve: the model's bytes per token of attention and per Mamba state "
        "(default: the built-in model's; as the settings token_bytes and state_bytes)",
    )


def _whatif(args: argparse.Namespace) -> int:
    if args.engine is None:
        return cmd_whatif(args)
    for option in ("curve", "tier_curve", "recording_out"):
        if getattr(args, option):
            flag = "--" + option.replace("_", "-")
            print(
                f"junction whatif: {flag} needs the recording here, not --engine", file=sys.stderr
            )
            return EXIT_BAD_INPUT
    try:
        settings = [parse_try(text) for text in args.settings]
    except ValueError as exc:
        print(f"junction whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return _remote(args, settings)
    except (CliError, ApiError) as exc:
        print(f"junction whatif: {exc}", file=sys.stderr)
        if isinstance(exc, CliError):
            return exc.status
        return EXIT_BAD_INPUT if exc.status is not None and exc.status < 500 else EXIT_FAILED


def _remote(args: argparse.Namespace, settings: list[dict]) -> int:
    """Queue the run on the control plane, follow it, print its report."""
    import json

    from rich.console import Console
    from tqdm import tqdm

    from whatif.report import report_from_dict
    from whatif.table import report_table

    api = client(args)
    if not settings:
        settings = _remote_defaults(api, args.engine)
    run = api.create_whatif(args.engine, settings, args.epoch)
    bar = tqdm(total=1, unit="req", desc=f"what-if {run.id}", disable=args.quiet or None)
    while run.status in ("queued", "running"):
        time.sleep(POLL_S)
        run = api.whatif(run.id)
        bar.total = max(run.progress_total or 1, 1)
        bar.n = run.progress_done or 0
        bar.refresh()
    bar.close()
    if run.status != "done":
        print(f"junction whatif: run {run.id} {run.status}: {run.error}", file=sys.stderr)
        return EXIT_FAILED
    Console(width=None if sys.stdout.isatty() else 132).print(
        report_table(report_from_dict(run.result))
    )
    if args.json:
        from engine.traces.replay import write_atomically

        write_atomically(args.json, [json.dumps(run.result) + "\n"])
    return 0


def _remote_defaults(api, engine_id: str) -> list[dict]:
    """The standard settings (`whatif.cli.default_settings`) for the engine's pools."""
    from whatif.cli import default_settings

    geometry = api.engine(engine_id).geometry
    num_blocks = geometry.group_num_blocks(ATTENTION) or 4096
    num_states = geometry.group_num_blocks(MAMBA) or num_blocks
    return default_settings(geometry.eviction or DEFAULT_EVICTION, num_blocks, num_states)
