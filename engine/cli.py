"""The `junction` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

from engine.config import (
    CHECKPOINT_MODES,
    DEFAULT_CHECKPOINT_INTERVAL,
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
)
from engine.runners import RUNNER_NAMES

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    """The cache and scheduler options `replay` and `serve` share (DESIGN.md section 4)."""
    group = parser.add_argument_group("cache")
    group.add_argument("--runner", choices=RUNNER_NAMES, default="null")
    group.add_argument("--block-size", type=int, default=16, help="attention block size Ba")
    group.add_argument("--mamba-block-size", type=int, default=512, help="Mamba block size Bm")
    group.add_argument(
        "--prefix-match-unit",
        type=int,
        default=None,
        help="match unit U (default: gcd of the block sizes)",
    )
    group.add_argument("--dcp-size", type=int, default=1, help="decode context parallel size D")
    group.add_argument("--eagle", action="store_true", help="EAGLE drafts: hits drop one unit")
    group.add_argument(
        "--no-partial-hits", action="store_true", help="hit only on lcm(Ba, Bm) boundaries"
    )
    group.add_argument(
        "--junction-checkpoints",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the Mamba state where a request leaves the cached prefix (default: on)",
    )
    group.add_argument(
        "--checkpoint-mode",
        choices=CHECKPOINT_MODES,
        default="inline",
        help="inline: write states inside chunks (default); stops: end chunks at checkpoints",
    )
    group.add_argument(
        "--checkpoint-interval",
        type=int,
        default=None,
        metavar="TOKENS",
        help=f"inline: also keep a Mamba state every TOKENS tokens, only in spare blocks "
        f"(default {DEFAULT_CHECKPOINT_INTERVAL} rounded up to the match unit; 0: none)",
    )
    group.add_argument("--max-num-batched-tokens", type=int, default=8192)
    group.add_argument("--long-prefill-threshold", type=int, default=0)
    group.add_argument("--num-blocks", type=int, default=4096, help="blocks per group")
    group.add_argument(
        "--num-mamba-blocks",
        type=int,
        default=None,
        help="Mamba state slots, when they should differ from --num-blocks",
    )
    group.add_argument(
        "--pin-max-share",
        type=float,
        default=0.25,
        help="the share of each group's blocks that pins may hold (default 0.25)",
    )
    group.add_argument(
        "--no-prefix-caching", action="store_true", help="cache off: the reference for outputs"
    )


def add_control_plane_options(parser: argparse.ArgumentParser) -> None:
    """Where `replay` and `serve` stream their cache events, and as which engine."""
    parser.add_argument("--engine-id", default="engine-0", help="this engine's id in events")
    parser.add_argument(
        "--control-plane",
        default=os.environ.get("JUNCTION_CONTROL_PLANE_URL"),
        help="control plane URL to stream cache events to (env JUNCTION_CONTROL_PLANE_URL)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("JUNCTION_API_TOKEN"),
        help="bearer token for the control plane (env JUNCTION_API_TOKEN)",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The torch runner's model: weights from a seed or a safetensors file, device, dtype."""
    group = parser.add_argument_group("model (torch runner)")
    group.add_argument("--weights", default=None, help="safetensors file of the model's shape")
    group.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    group.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        seed=args.seed, device=args.device, dtype=args.dtype, weights_path=args.weights
    )


def configs_from_args(args: argparse.Namespace) -> tuple[CacheConfig, SchedulerConfig]:
    cache = CacheConfig(
        block_size=args.block_size,
        mamba_block_size=args.mamba_block_size,
        prefix_match_unit=args.prefix_match_unit,
        dcp_size=args.dcp_size,
        num_blocks=args.num_blocks,
        num_mamba_blocks=args.num_mamba_blocks,
        pin_max_share=args.pin_max_share,
        enable_prefix_caching=not args.no_prefix_caching,
        partial_hits=not args.no_partial_hits,
        junction_checkpoints=args.junction_checkpoints,
        checkpoint_mode=args.checkpoint_mode,
        checkpoint_interval=args.checkpoint_interval,
        eagle=args.eagle,
    )
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_threshold=args.long_prefill_threshold,
    )
    return cache, scheduler


def cmd_replay(args: argparse.Namespace) -> int:
    from engine.trace import TraceError, iter_trace, scan_trace

    if args.events_out and args.control_plane:
        print(
            "junction replay: give --events-out or --control-plane, not both "
            "(the control plane keeps the events itself)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        cache, scheduler = configs_from_args(args)
        num_items = scan_trace(args.trace)  # the whole trace is valid before anything runs
    except (ValueError, TraceError) as exc:
        print(f"junction replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with contextlib.ExitStack() as outputs:
        try:
            return _run_replay(args, cache, scheduler, iter_trace(args.trace), num_items, outputs)
        except BrokenPipeError:  # `junction replay ... | head`: the reader has what it wanted
            sys.stderr.close()
            return 0


def _run_replay(args, cache, scheduler, items, num_items: int, outputs) -> int:
    """The replay itself: events go to `--events-out`, the control plane, or nowhere (then the
    engine builds none); records stream to `--out` or a spool for stdout, never into a list."""
    from tqdm import tqdm

    from engine.engine import Engine
    from engine.event_log import EventLog
    from engine.events import ListSink, NullSink
    from engine.replay import ReplaySummary, atomic_output, jsonl, replay_records
    from engine.runners.ledger import LedgerMismatch

    if args.control_plane:
        sink = ListSink()  # the publisher drains it after every step into its bounded buffer
    elif args.events_out:
        sink = EventLog(outputs.enter_context(atomic_output(args.events_out)))
    else:
        sink = NullSink()
    try:
        engine = Engine(
            cache,
            scheduler,
            model_config_from_args(args),
            runner=args.runner,
            sink=sink,
            engine_id=args.engine_id,
        )
    except (ValueError, OSError) as exc:
        print(f"junction replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    publisher = None
    if args.control_plane:
        from engine.server.commands import CommandQueue

        publisher = make_publisher(args, engine.model_config.name)
        if publisher is None:
            return EXIT_BAD_INPUT
        commands = CommandQueue()
        commands.attach(engine)
        publisher.on_command = commands.on_command
        publisher.attach(engine)
    progress = tqdm(total=num_items, unit="line", disable=args.quiet or None, file=sys.stderr)
    summary = ReplaySummary()
    records = replay_records(
        engine, items, summary, args.concurrency, on_item=lambda _: progress.update()
    )
    try:
        if args.out:
            with atomic_output(args.out) as handle:
                handle.writelines(jsonl(records))
        else:
            spool = outputs.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
            spool.writelines(jsonl(records))
    except ValueError as exc:
        print(f"junction replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LedgerMismatch as exc:
        print(f"junction replay: the ledger found a wrong reuse: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        progress.close()
        if publisher is not None:
            finish_publishing(publisher, args.flush_timeout, args.quiet)
    if args.snapshot_out:
        with atomic_output(args.snapshot_out) as handle:
            json.dump(engine.snapshot(), handle)
            handle.write("\n")
    if not args.out:
        spool.seek(0)
        shutil.copyfileobj(spool, sys.stdout)
        sys.stdout.flush()
    if not args.quiet:
        events = f", {sink.num_events} events" if isinstance(sink, EventLog) else ""
        print(
            f"{summary.num_requests} requests, hit {summary.num_cached_tokens}/"
            f"{summary.num_prompt_tokens} prompt tokens ({summary.hit_rate:.1%}), computed "
            f"{summary.num_computed_tokens}, {summary.num_preemptions} preemptions, "
            f"{summary.num_steps} steps in {summary.wall_s:.2f}s{events}",
            file=sys.stderr,
        )
    return 0


def make_publisher(args: argparse.Namespace, model_name: str):
    """An `EventPublisher` to `--control-plane` (not yet attached), or None and a message when
    the options are wrong. Imported here: the command line stays web-free."""
    from engine.server.publisher import EventPublisher

    if not args.token:
        print(
            f"junction {args.command}: --control-plane needs --token (or JUNCTION_API_TOKEN)",
            file=sys.stderr,
        )
        return None
    try:
        publisher = EventPublisher(args.control_plane, args.token, model={"name": model_name})
    except ValueError as exc:
        print(f"junction {args.command}: {exc}", file=sys.stderr)
        return None
    return publisher


def finish_publishing(publisher, timeout_s: float, quiet: bool) -> None:
    """Wait (up to `timeout_s`) for the control plane to acknowledge every event, then stop."""
    try:
        if not quiet:
            print(
                f"junction replay: waiting up to {timeout_s:g}s for the control plane to "
                f"acknowledge {publisher.stats().num_buffered} event frames",
                file=sys.stderr,
            )
        if publisher.flush(timeout_s):
            if not quiet:
                print("junction replay: the control plane has every event", file=sys.stderr)
            return
        stats = publisher.stats()
        print(
            f"junction replay: warning: {stats.num_buffered} event frames were not acknowledged "
            f"by the control plane at {publisher.url} within {timeout_s:g}s (last error: "
            f"{stats.last_error or 'none'}); its block table is behind this replay",
            file=sys.stderr,
        )
    finally:
        publisher.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="junction",
        description="Prefix-cache engine and control plane for hybrid attention + Mamba models.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    rep = commands.add_parser("replay", help="run a JSONL trace through the engine")
    rep.add_argument("trace", help="trace file, one JSON request or pin a line")
    add_cache_options(rep)
    add_model_options(rep)
    rep.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests in flight (1: each finishes before the next starts)",
    )
    rep.add_argument("--out", help="write the per-request JSON lines here (default: stdout)")
    rep.add_argument("--snapshot-out", help="write the final block table here as JSON")
    rep.add_argument(
        "--events-out",
        help="stream every cache event here as JSON lines (default: build no events)",
    )
    rep.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    add_control_plane_options(rep)
    rep.add_argument(
        "--flush-timeout",
        type=float,
        default=30.0,
        help="seconds to wait at the end for the control plane to acknowledge every event",
    )
    rep.set_defaults(func=cmd_replay)
    from engine.server.cli import add_serve_parser  # after this module's names exist

    add_serve_parser(commands)
    from api.cli import add_api_parser

    add_api_parser(commands)
    from api.pins_cli import add_pin_parsers

    add_pin_parsers(commands)
    from engine.bench.cli import add_bench_parser

    add_bench_parser(commands)
    from jobs.cli import add_jobs_parsers

    add_jobs_parsers(commands)
    from dashboard.cli import add_dashboard_parser

    add_dashboard_parser(commands)
    from stack.cli import add_up_parser

    add_up_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
