"""Interval states: the hit against the oracle, and the Mamba blocks they hold, by interval.

.venv/bin/python benchmarks/interval.py [--intervals 0,64,128,256] [--runner null|ledger]
    [--pressure 64] [--torch-rounds 3]

Every spec of the nightly suite runs with the default policy (junction checkpoints, inline) at
concurrency 1 and at the spec's concurrency, once per `checkpoint_interval` (0: none), side by
side in one run. Each cell is the hit as a share of the oracle, with the peak of Mamba blocks
not free. `--pressure N` adds the same runs on a Mamba pool of N blocks, where interval states
must give way to every better state (their total hit must not fall below interval 0's).
`--torch-rounds N` then times what the states cost: a small generated-shared-prefix workload
on the torch runner, each interval once per round, rounds interleaved, and prints each
interval's median wall time as a ratio to interval 0's (this machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.progress import track
from rich.table import Table

from bench import STANDARD_SUITE
from bench.run import StepMeter, build_engine
from bench.spec import BenchmarkSpec
from engine.traces.replay import replay
from workloads import oracle


def run(spec: BenchmarkSpec, interval: int, concurrency: int, mamba_blocks: int | None) -> dict:
    geometry = spec.geometry
    if mamba_blocks is not None:
        geometry = geometry.model_copy(update={"num_mamba_blocks": mamba_blocks})
    spec = spec.model_copy(update={"geometry": geometry, "concurrency": concurrency})
    meter = StepMeter(lambda done: None)
    engine = build_engine(spec, "junction_inline", meter, checkpoint_interval=interval)
    items = spec.workload.build().items(with_pins=False)
    truth = oracle(items, geometry.match_unit, geometry.eagle)
    _, summary = replay(engine, items, concurrency)
    return {
        "share": summary.num_cached_tokens / max(truth.num_oracle_tokens, 1),
        "hit": summary.num_cached_tokens,
        "mamba_peak": meter.peak_blocks_used.get("mamba", 0),
    }


def time_torch(intervals: list[int], rounds: int) -> Table:
    spec = next(s for s in STANDARD_SUITE if s.name == "gsp-unaligned-nightly")
    workload = spec.workload.model_copy(update={"num_groups": 2, "prompts_per_group": 6})
    spec = spec.model_copy(update={"runner": "torch", "workload": workload, "concurrency": 1})
    items = workload.build().items(with_pins=False)
    walls: dict[int, list[float]] = {interval: [] for interval in intervals}
    hits: dict[int, int] = {}
    for _ in track(range(rounds), description="torch rounds"):
        for interval in intervals:
            engine = build_engine(spec, "junction_inline", checkpoint_interval=interval)
            started = time.perf_counter()
            _, summary = replay(engine, items, 1)
            walls[interval].append(time.perf_counter() - started)
            hits[interval] = summary.num_cached_tokens
    base = statistics.median(walls[intervals[0]])
    table = Table(title=f"torch runner, {len(items)} requests: median wall of {rounds} rounds")
    columns = ("interval", "hit tokens", "median wall (s)", f"ratio to interval {intervals[0]}")
    for column in columns:
        table.add_column(column, justify="right")
    for interval in intervals:
        wall = statistics.median(walls[interval])
        table.add_row(str(interval), str(hits[interval]), f"{wall:.2f}", f"{wall / base:.2f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="0,64,128,256")
    parser.add_argument("--runner", choices=("null", "ledger"), default="null")
    parser.add_argument("--pressure", type=int, default=0, help="also on N Mamba blocks")
    parser.add_argument("--torch-rounds", type=int, default=0, help="also time the torch runner")
    args = parser.parse_args()
    intervals = [int(value) for value in args.intervals.split(",")]
    cases = []
    for spec in STANDARD_SUITE:
        spec = spec.model_copy(update={"runner": args.runner})
        for concurrency in sorted({1, spec.concurrency}):
            cases.append((spec, concurrency, None))
            if args.pressure:
                cases.append((spec, concurrency, args.pressure))
    table = Table(title="hit / oracle (peak Mamba blocks) by checkpoint_interval")
    table.add_column("spec")
    table.add_column("conc.", justify="right")
    table.add_column("mamba pool", justify="right")
    for interval in intervals:
        table.add_column(f"interval {interval}", justify="right")
    worst = dict.fromkeys(intervals, 1.0)
    for spec, concurrency, blocks in track(cases, description="replaying"):
        cells = []
        for interval in intervals:
            if interval % spec.geometry.match_unit:
                cells.append(f"- (U {spec.geometry.match_unit})")
                continue
            result = run(spec, interval, concurrency, blocks)
            if blocks is None:
                worst[interval] = min(worst[interval], result["share"])
            cells.append(f"{result['share']:.1%} ({result['mamba_peak']})")
        pool = blocks or spec.geometry.num_mamba_blocks or spec.geometry.num_blocks
        table.add_row(spec.name, str(concurrency), str(pool), *cells)
    table.add_row(
        "worst share (full pools)", "", "", *(f"{worst[interval]:.1%}" for interval in intervals)
    )
    console = Console(width=200)
    console.print(table)
    if args.torch_rounds:
        console.print(time_torch(intervals, args.torch_rounds))


if __name__ == "__main__":
    main()
