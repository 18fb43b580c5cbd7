"""`junction replay`: a JSONL trace through the engine, its records out, its cache events to a
file or the control plane.

`cli/main.py` registers it with `add_replay_parser(commands)`; the options it shares with
`junction serve` are `engine/setup/options.py`'s. It sits beside `junction serve`, above the
engine, because it can stream to the control plane (`publish/streaming.py`); without
`--control-plane` it loads no web library.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile

from engine.setup.options import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    add_cache_options,
    add_model_options,
    add_tier_options,
    configs_from_args,
    tier_config_from_args,
)
from publish.streaming import (
    add_control_plane_options,
    connect,
    finish_publishing,
    make_publisher,
)


def add_replay_parser(commands: argparse._SubParsersAction) -> None:
    rep = commands.add_parser("replay", help="run a JSONL trace through the engine")
    rep.add_argument("trace", help="trace file, one JSON request or pin a line")
    add_cache_options(rep)
    add_tier_options(rep, host_default="0")
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


def cmd_replay(args: argparse.Namespace) -> int:
    from engine.traces.trace import TraceError, iter_trace, scan_trace

    if args.events_out and args.control_plane:
        print(
            "junction replay: give --events-out or --control-plane, not both "
            "(the control plane keeps the events itself)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        configs = configs_from_args(args)
        tiers = tier_config_from_args(args, configs.cache, configs.model)
        num_items = scan_trace(args.trace)  # the whole trace is valid before anything runs
    except (ValueError, TraceError) as exc:
        print(f"junction replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with contextlib.ExitStack() as outputs:
        try:
            return _run_replay(args, configs, tiers, iter_trace(args.trace), num_items, outputs)
        except BrokenPipeError:  # `junction replay ... | head`: the reader has what it wanted
            sys.stderr.close()
            return 0


def _run_replay(args, configs, tiers, items, num_items: int, outputs) -> int:
    """The replay itself: events go to `--events-out`, the control plane, or nowhere (then the
    engine builds none); records stream to `--out` or a spool for stdout, never into a list."""
    from tqdm import tqdm

    from engine.engine import Engine
    from engine.events import ListSink, NullSink
    from engine.runners.ledger import LedgerMismatch
    from engine.traces.event_log import EventLog
    from engine.traces.replay import ReplaySummary, atomic_output, jsonl, replay_records

    if args.control_plane:
        sink = ListSink()  # the publisher drains it after every step into its bounded buffer
    elif args.events_out:
        sink = EventLog(outputs.enter_context(atomic_output(args.events_out)))
    else:
        sink = NullSink()
    try:
        engine = Engine(
            *configs,
            runner=args.runner,
            sink=sink,
            engine_id=args.engine_id,
            tiers=tiers,
        )
    except (ValueError, OSError) as exc:
        print(f"junction replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    publisher = None
    if args.control_plane:
        from engine.model.hf.tokenizer import load_tokenizer
        from engine.setup.model_card import model_card

        publisher = make_publisher(args, model_card(configs.model, configs.cache))
        if publisher is None:
            return EXIT_BAD_INPUT
        connect(publisher, engine, load_tokenizer(configs.model.model_dir))
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
            finish_publishing(publisher, "replay", args.flush_timeout, args.quiet)
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
