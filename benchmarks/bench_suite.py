"""The nightly suite in the terminal: every spec of `STANDARD_SUITE`, a table each.

.venv/bin/python benchmarks/bench_suite.py [--out results.json] [--runner ledger|null]
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console

from bench import STANDARD_SUITE, run_benchmark
from bench.table import results_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every run's results here, as a JSON list")
    parser.add_argument("--runner", choices=("null", "ledger", "torch"), default=None)
    args = parser.parse_args()
    console = Console(width=200)
    everything = []
    started = time.perf_counter()
    for spec in STANDARD_SUITE:
        if args.runner is not None:
            spec = spec.model_copy(update={"runner": args.runner})
        results = run_benchmark(spec)
        everything.append(results)
        console.print(results_table(results))
    console.print(f"{len(STANDARD_SUITE)} runs in {time.perf_counter() - started:.1f}s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(everything, handle, indent=2)


if __name__ == "__main__":
    main()
