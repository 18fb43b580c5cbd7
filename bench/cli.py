"""`junction bench SPEC`: run a benchmark spec in the terminal, with a progress bar and a table.

`cli/main.py` registers it with `add_bench_parser(commands)`. A spec is a JSON file; or give
`--workload KIND` and `--set key=value` params instead. `--runner`, `--modes`, `--concurrency`
and `--set geometry.key=value` override the file. `--engine URL` sends the workload to a live
`junction serve` instead of in-process engines. Exit 2 on a bad spec, 1 when the run fails (a
wrong reuse the ledger caught, a request the engine refused); `--out` is written only after a
run succeeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.modes import RUNNER_NAMES
from engine.setup.options import EXIT_BAD_INPUT, EXIT_FAILED

BENCH = "junction bench"


def add_bench_parser(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench",
        help="replay a workload once per cache mode and compare hit rates with the oracle",
        description=__doc__.splitlines()[0],
    )
    bench.add_argument("spec", nargs="?", help="benchmark spec, a JSON file")
    bench.add_argument("--workload", help="workload kind, instead of (or over) the spec's")
    bench.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a workload param (num_groups=8) or geometry.KEY, model.KEY; repeatable",
    )
    bench.add_argument("--name", help="the run's name (default: the spec's, or the kind)")
    bench.add_argument("--runner", choices=RUNNER_NAMES)
    bench.add_argument("--modes", help="comma-separated modes (default: the spec's, or all)")
    bench.add_argument("--concurrency", type=int)
    bench.add_argument("--out", help="write the results JSON here")
    bench.add_argument("--trace-out", help="also write the generated trace (with its pin lines)")
    bench.add_argument(
        "--engine", metavar="URL", help="run against a live `junction serve` at URL instead"
    )
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)


def load_spec_object(args: argparse.Namespace) -> dict:
    """The spec as a dict: the file, then the command line's overrides."""
    if args.spec is None and args.workload is None:
        raise ValueError("give a SPEC file or --workload KIND")
    obj: dict = {}
    if args.spec is not None:
        try:
            obj = json.loads(Path(args.spec).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"cannot read spec {args.spec}: {exc.strerror}") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"spec {args.spec} is not valid JSON ({exc.msg} at line {exc.lineno})"
            ) from exc
        if not isinstance(obj, dict):
            raise ValueError(f"spec {args.spec} must be a JSON object")
    if args.workload is not None:
        workload = obj.get("workload") if isinstance(obj.get("workload"), dict) else {}
        if workload.get("kind") != args.workload:
            workload = {}  # another kind's params would not apply
        obj["workload"] = {**workload, "kind": args.workload}
        obj.setdefault("name", args.workload)
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        section, dot, field = key.partition(".")
        if not dot:
            section, field = "workload", key
        if section not in ("workload", "geometry", "model"):
            raise ValueError(f"--set {key}: the section must be workload, geometry or model")
        target = obj.setdefault(section, {})
        if not isinstance(target, dict):
            raise ValueError(f"--set {key}: the spec's {section} is not an object")
        target[field] = _value(raw)
    for name in ("name", "runner", "concurrency"):
        if getattr(args, name) is not None:
            obj[name] = getattr(args, name)
    if args.modes is not None:
        obj["modes"] = [m.strip() for m in args.modes.split(",") if m.strip()]
    return obj


def _value(raw: str):
    """A JSON value (8, 1.5, true, null, "x"), or the raw text when it is not JSON."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def cmd_bench(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from rich.console import Console
    from tqdm import tqdm

    from bench import BenchmarkError, BenchmarkSpec, run_benchmark
    from bench.table import results_table
    from engine.runners.ledger import LedgerMismatch
    from engine.traces.replay import write_atomically
    from engine.traces.trace import field_errors

    try:
        spec = BenchmarkSpec.model_validate(load_spec_object(args))
    except ValidationError as exc:
        problems = "".join(f"\n  {problem}" for problem in field_errors(exc, "spec"))
        print(f"{BENCH}: bad spec:{problems}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as exc:
        print(f"{BENCH}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bar = tqdm(total=1000, unit="‰", disable=args.quiet or None, file=sys.stderr)

    def progress(fraction: float, message: str) -> None:
        bar.set_description(message, refresh=False)
        bar.update(round(fraction * 1000) - bar.n)

    try:
        if args.engine:
            from bench.remote import run_remote

            results = run_remote(spec, args.engine, progress)
        else:
            results = run_benchmark(spec, progress)
    except LedgerMismatch as exc:
        print(f"{BENCH}: the ledger found a wrong reuse: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (BenchmarkError, OSError) as exc:
        print(f"{BENCH}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        bar.close()
    Console(width=200).print(results_table(results))
    if args.engine:
        print(f"{BENCH}: {results['note']}", file=sys.stderr)
    if args.trace_out:
        write_atomically(args.trace_out, [spec.workload.build().jsonl(with_pins=True)])
    if args.out:
        write_atomically(args.out, [json.dumps(results, indent=2) + "\n"])
    return 0
