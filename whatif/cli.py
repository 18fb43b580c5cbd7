"""`junction whatif`'s local half: replay a trace or a recording under other settings and say
what each buys (the command's parser, and its `--engine` half, are `client/whatif_cli.py`'s).

The input is a trace (`--trace`, run once with the cache options given: what "ran") or a
recording (`--recording`: `junction whatif --recording-out`'s JSON lines, or a bridged vLLM or
SGLang engine's from `junction attach --recording-out`, whose settings are then the cache
options given, Junction's defaults unless said). Each `--try` is one
setting, `key=value` pairs separated by commas (`--try eviction=lru --try
block_size=32,mamba_block_size=256 --try mode=vllm --try num_blocks=8192`); with none, a
standard set is tried: vLLM's rules, every other eviction policy, and half and twice the memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine.setup.options import EXIT_BAD_INPUT, configs_from_args


def setting_keys() -> list[str]:
    from whatif.settings import WhatIfSetting

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


#: what a bridged peer's recording tries by default: Junction's engine with the cache options
#: given, and the peer's own rules in that memory
PEER_SETTINGS = [{"label": "Junction"}, {"label": "as vLLM would", "mode": "vllm"}]


def default_settings(ran_eviction: str, num_blocks: int, num_mamba_blocks: int) -> list[dict]:
    """vLLM's rules, every other eviction policy, half and twice the memory."""
    from engine.cache.eviction import EVICTION_NAMES

    tried: list[dict] = [{"mode": "vllm", "label": "as vLLM would"}]
    tried += [{"eviction": name} for name in EVICTION_NAMES if name != ran_eviction]
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
    from whatif.settings import parse_settings

    try:
        raw = [parse_try(text) for text in args.settings]
        settings = parse_settings(raw)
        recording = _recording(args)
    except (OSError, ValueError) as exc:
        print(f"junction whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.recording_out:
        from engine.traces.replay import write_atomically
        from whatif.recording import dump_lines

        write_atomically(
            args.recording_out, (line.decode() + "\n" for line in dump_lines(recording))
        )
    base = None
    if recording.geometry.is_peer:  # the cache options are Junction's, to try in its place
        configs = configs_from_args(args)
        base = (configs.cache, configs.scheduler)
        if not raw:
            settings = parse_settings(PEER_SETTINGS)
    elif not raw:
        settings = _fitting_defaults(recording)
    return _run(args, recording, settings, base)


def _fitting_defaults(recording) -> list:
    """The standard settings, less those whose memory cannot hold the longest request (each
    said on stderr)."""
    from whatif.run import check_fits
    from whatif.settings import apply, parse_settings, ran_configs

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


def limits_of(args: argparse.Namespace):
    """`--max-bytes` and `--max-seconds`, else `JUNCTION_WHATIF_MAX_BYTES` and
    `JUNCTION_WHATIF_MAX_SECONDS`, else `whatif.budget`'s defaults; a `ValueError` names the
    one that is not a positive number."""
    from whatif.budget import BYTES_SETTING, SECONDS_SETTING, Limits

    values = {}
    for field, flag, name, kind in (
        ("max_bytes", "--max-bytes", BYTES_SETTING, int),
        ("max_seconds", "--max-seconds", SECONDS_SETTING, float),
    ):
        given = getattr(args, field, None)
        if given is None and os.environ.get(name):
            try:
                given = kind(os.environ[name])
            except ValueError:
                raise ValueError(f"{name} must be a number, got {os.environ[name]!r}") from None
        if given is not None and given <= 0:
            raise ValueError(f"{flag} ({name}) must be positive, got {given}")
        if given is not None:
            values[field] = given
    return Limits(**values)


def _recording(args: argparse.Namespace):
    from whatif.recording import load_lines

    if args.recording:
        with Path(args.recording).open("rb") as handle:
            return load_lines(handle)
    from engine.traces.trace import read_trace

    configs = configs_from_args(args)
    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {args.concurrency}")
    return record_trace(read_trace(args.trace), configs.cache, configs.scheduler, args)


def record_trace(items, cache, scheduler, args: argparse.Namespace):
    """Run the trace once with these configs and keep what a what-if replays."""
    from tqdm import tqdm

    from engine.engine import Engine
    from engine.traces.replay import ReplaySummary, replay_records
    from whatif.recording import ChainSink, from_events

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


def _run(args: argparse.Namespace, recording, settings, base=None) -> int:
    from rich.console import Console
    from tqdm import tqdm

    from whatif.budget import WhatIfTimedOut
    from whatif.run import run_whatif
    from whatif.table import report_table

    bar = tqdm(total=1, unit="req", desc="what-if", disable=args.quiet or None, file=sys.stderr)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    if args.curve and not 0 < args.curve_rate <= 1:
        print(
            f"junction whatif: --curve-rate must lie in (0, 1], got {args.curve_rate}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        report = run_whatif(recording, settings, progress, base, limits_of(args))
    except (ValueError, WhatIfTimedOut) as exc:
        bar.close()
        print(f"junction whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bar.close()
    console = Console(width=None if sys.stdout.isatty() else 132)
    console.print(report_table(report))
    try:
        if args.curve:
            console.print(_curve_table(args, recording, base))
        if getattr(args, "tier_curve", None):
            from whatif.tier_table import tier_curve_table

            console.print(tier_curve_table(args, recording, base, limits_of(args)))
    except (ValueError, WhatIfTimedOut) as exc:
        print(f"junction whatif: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        from engine.traces.replay import write_atomically

        write_atomically(args.json, [json.dumps(report.as_dict(with_hits=True)) + "\n"])
    return 0


#: fewer requests than this are replayed whole for the curve, whatever `--curve-rate` says
MIN_SAMPLED_REQUESTS = 2000
#: the curve's sizes, as shares of the memory that ran
CURVE_SHARES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)


def _curve_table(args: argparse.Namespace, recording, base):
    """Hit rate against memory: the exact LRU curve and the policy that ran (sampled)."""
    from rich.table import Table
    from tqdm import tqdm

    from whatif.curves import block_stream, lru_curve, policy_curve
    from whatif.settings import ran_configs

    cache, scheduler = base if base is not None else ran_configs(recording.geometry)
    # a small recording has too few prefix families to sample: it is replayed whole
    rate = args.curve_rate if recording.num_requests >= MIN_SAMPLED_REQUESTS else 1.0
    ratio = cache.mamba_num_blocks / cache.num_blocks
    sizes = [
        size
        for size in sorted({max(1, round(cache.num_blocks * share)) for share in CURVE_SHARES})
        if _fits(recording, cache, size, max(1, round(size * ratio)))
    ]
    exact = lru_curve(block_stream(recording, cache.attention_block_size), sizes).hit_rates
    with tqdm(total=len(sizes), desc="curve", disable=args.quiet or None, file=sys.stderr) as bar:
        points = policy_curve(
            recording, cache, scheduler, sizes, rate, progress=lambda _: bar.update()
        )
    how = (
        "full replays"
        if rate == 1
        else f"replays of a {rate:.0%} sample of the prefix families, corrected by the exact "
        "LRU curve"
    )
    table = Table(title=f"hit rate against memory ({cache.eviction}: {how})", title_justify="left")
    for header in ("attention blocks", "Mamba slots", "LRU, attention only", cache.eviction):
        table.add_column(header, justify="right")
    for size, lru, point in zip(sizes, exact.tolist(), points, strict=True):
        table.add_row(
            f"{size:,}", f"{max(1, round(size * ratio)):,}", f"{lru:.1%}", f"{point.hit_rate:.1%}"
        )
    return table


def _fits(recording, cache, num_blocks: int, num_mamba_blocks: int) -> bool:
    """Whether pools of these sizes hold the recording's longest request (and its pins)."""
    import dataclasses

    from whatif.run import check_fits

    sized = dataclasses.replace(cache, num_blocks=num_blocks, num_mamba_blocks=num_mamba_blocks)
    try:
        check_fits(recording, sized, "curve")
    except ValueError:
        return False
    return True
