"""`junction whatif`: replay what an engine ran under other settings and say what each buys.

The input is a trace (`--trace`, run once with the cache options given: what "ran") or a
recording (`--recording`, `junction whatif --recording-out`'s JSON lines). Each `--try` is one
setting, `key=value` pairs separated by commas (`--try eviction=lru --try
block_size=32,mamba_block_size=256 --try mode=vllm --try num_blocks=8192`); with none, a
standard set is tried: vLLM's rules, every other eviction policy, and half and twice the memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.options import EXIT_BAD_INPUT, add_cache_options, add_model_options, configs_from_args


def add_whatif_parser(commands: argparse._SubParsersAction) -> None:
    cmd = commands.add_parser(
        "whatif", help="replay a trace or recording under other settings, hashes only"
    )
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="a replay trace: run it once with the cache options")
    source.add_argument("--recording", help="a recording's JSON lines (--recording-out)")
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
        help="a setting to try (keys: " + ", ".join(_setting_keys()) + "); repeat for more",
    )
    cmd.add_argument("--json", help="write the report here as JSON, with per-request hits")
    cmd.add_argument("--recording-out", help="write the recording here (JSON lines)")
    cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    cmd.set_defaults(func=cmd_whatif)


def _setting_keys() -> list[str]:
    from engine.whatif.settings import WhatIfSetting

    return list(WhatIfSetting.model_fields)


def parse_try(text: str) -> dict:
    """`key=value,key=value` as a setting's JSON (numbers as numbers)."""
    setting: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"--try {text!r}: {part!r} is not key=value")
        setting[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return setting


def default_settings(ran_eviction: str, num_blocks: int, num_mamba_blocks: int) -> list[dict]:
    """vLLM's rules, every other eviction policy, half and twice the memory."""
    from engine.cache.eviction import EVICTION_POLICIES

    tried: list[dict] = [{"mode": "vllm", "label": "as vLLM would"}]
    tried += [{"eviction": name} for name in EVICTION_POLICIES if name != ran_eviction]
    for factor, word in ((0.5, "half"), (2, "twice")):
        tried.append(
            {
                "label": f"{word} the memory",
                "num_blocks": max(1, int(num_blocks * factor)),
                "num_mamba_blocks": max(1, int(num_mamba_blocks * factor)),
            }
        )
    return tried


def cmd_whatif(args: argparse.Namespace) -> int:
    from engine.whatif.settings import parse_settings

    try:
        raw = [parse_try(text) for text in args.settings]
        settings = parse_settings(raw)
        recording = _recording(args)
    except (OSError, ValueError) as exc:
        print(f"junction whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.recording_out:
        from engine.replay import write_atomically
        from engine.whatif.recording import dump_lines

        write_atomically(
            args.recording_out, (line.decode() + "\n" for line in dump_lines(recording))
        )
    if not raw:
        settings = _fitting_defaults(recording)
    return _run(args, recording, settings)


def _fitting_defaults(recording) -> list:
    """The standard settings, less those whose memory cannot hold the longest request (each
    said on stderr)."""
    from engine.whatif.run import check_fits
    from engine.whatif.settings import apply, parse_settings, ran_configs

    cache, _ = ran_configs(recording.geometry)
    kept = []
    for setting in parse_settings(
        default_settings(cache.eviction, cache.num_blocks, cache.mamba_num_blocks)
    ):
        try:
            check_fits(recording, apply(setting, cache, recording.unit), setting.name())
        except ValueError as exc:
            print(f"junction whatif: skipped: {exc}", file=sys.stderr)
            continue
        kept.append(setting)
    return kept


def _recording(args: argparse.Namespace):
    from engine.whatif.recording import load_lines

    if args.recording:
        with Path(args.recording).open("rb") as handle:
            return load_lines(handle)
    from engine.trace import read_trace

    configs = configs_from_args(args)
    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {args.concurrency}")
    return record_trace(read_trace(args.trace), configs.cache, configs.scheduler, args)


def record_trace(items, cache, scheduler, args: argparse.Namespace):
    """Run the trace once with these configs and keep what a what-if replays."""
    from tqdm import tqdm

    from engine.engine import Engine
    from engine.replay import ReplaySummary, replay_records
    from engine.whatif.recording import ChainSink, from_events

    sink = ChainSink()
    engine = Engine(cache, scheduler, runner="null", sink=sink)
    bar = tqdm(
        total=len(items), unit="line", desc="recording", disable=args.quiet or None, file=sys.stderr
    )
    for _ in replay_records(
        engine, items, ReplaySummary(), args.concurrency, on_item=lambda _: bar.update()
    ):
        pass
    bar.close()
    return from_events(engine.cache_geometry(), sink.events, args.concurrency)


def _run(args: argparse.Namespace, recording, settings) -> int:
    from rich.console import Console
    from tqdm import tqdm

    from engine.whatif.run import run_whatif
    from engine.whatif.table import report_table

    bar = tqdm(total=1, unit="req", desc="what-if", disable=args.quiet or None, file=sys.stderr)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        report = run_whatif(recording, settings, progress)
    except ValueError as exc:
        bar.close()
        print(f"junction whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bar.close()
    Console(width=None if sys.stdout.isatty() else 132).print(report_table(report))
    if args.json:
        from engine.replay import write_atomically

        write_atomically(args.json, [json.dumps(report.as_dict(with_hits=True)) + "\n"])
    return 0
