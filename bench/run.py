"""`run_benchmark`: replay a workload once per mode through an in-process `Engine`, beside the
oracle, and measure each mode.

Per mode: token hit rate and the oracle's; prompt tokens computed; forward passes (engine steps
that ran the model); copy-on-write copies; TTFT median and p99; throughput (prompt and output
tokens per second of wall time); and the peak, over steps, of each group's blocks not free
(in use or pinned; cached free blocks count as free).

The oracle of the `pins` mode counts the pinned prefixes (a pin is made before any request, so
even a group's first request shares it); every other mode's oracle does not.

Beside the oracle, the bound under memory (`workloads.bound`): what an offline policy
that knows the future keeps in the spec's pools (`num_blocks`, `num_mamba_blocks`) at its
concurrency, pins ignored. Every mode's row carries it as `bound_hit_rate`, the same number for
every mode (the `pins` mode may pass it: its pins are not in the bound).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.spec import BenchmarkSpec
from engine.cache.block_pool import BlockPool
from engine.cache.manager import BlockCopy
from engine.engine import Engine
from engine.events import GROUPS
from engine.modes import MODE_CACHE_OPTIONS
from engine.request import SamplingParams
from engine.runners import make_runner
from engine.runners.base import Runner
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk, SchedulerOutput
from engine.tiers.moves import UnitLoad, UnitSave
from engine.tiers.unit import TierUnit
from engine.traces.replay import replay
from engine.traces.trace import TraceItem
from workloads import Workload, oracle
from workloads.bound import BoundResult, Budget, bound

Progress = Callable[[float, str], None]


class BenchmarkError(ValueError):
    """A run that cannot go on: the message says why (a request the pools cannot hold)."""


def run_benchmark(spec: BenchmarkSpec | dict, progress: Progress | None = None) -> dict:
    """Run every mode of `spec` (a dict is validated first); returns the results as a
    JSON-serializable dict. `progress(fraction, message)` is called as requests finish.

    A ledger runner that finds a wrong reuse raises `LedgerMismatch`; a request the engine
    refuses raises `BenchmarkError`.
    """
    if not isinstance(spec, BenchmarkSpec):
        spec = BenchmarkSpec.model_validate(spec)
    report = progress or (lambda fraction, message: None)
    report(0.0, f"{spec.name}: generating the {spec.workload.kind} workload")
    workload = spec.workload.build()
    unit, eagle = spec.geometry.match_unit, spec.geometry.eagle
    plain_items = workload.items(with_pins=False)
    pinned_items = workload.items(with_pins=True)
    plain_oracle = oracle(plain_items, unit, eagle)
    pinned_oracle = oracle(pinned_items, unit, eagle)
    plain_bound = spec_bound(spec, plain_items)
    if spec.runner == "torch":
        report(0.0, f"{spec.name}: warming the model up")
        warm_up(spec)
    rows = []
    for index, mode in enumerate(spec.modes):
        items = pinned_items if mode == "pins" else plain_items
        mode_oracle = pinned_oracle if mode == "pins" else plain_oracle

        def step_progress(done: int, mode=mode, index=index) -> None:
            fraction = (index + done / max(workload.num_requests, 1)) / len(spec.modes)
            report(fraction, f"{mode}: {done}/{workload.num_requests} requests")

        row = run_mode(spec, mode, items, step_progress)
        row["oracle_hit_rate"] = mode_oracle.hit_rate
        row["bound_hit_rate"] = plain_bound.hit_rate
        rows.append(row)
    report(1.0, f"{spec.name}: done")
    return {
        "name": spec.name,
        "runner": spec.runner,
        "concurrency": spec.concurrency,
        "geometry": spec.geometry.model_dump(mode="json"),
        "match_unit": unit,
        "modes": rows,
        "oracle": plain_oracle.as_dict(),
        "oracle_with_pins": pinned_oracle.as_dict(),
        "bound": plain_bound.as_dict(),
        "workload": workload_summary(spec, workload),
    }


def spec_bound(spec: BenchmarkSpec, items: list[TraceItem]) -> BoundResult:
    """The bound under memory of `items` in the spec's pools, at its concurrency."""
    cache = spec.geometry.cache_config()
    return bound(
        items,
        cache.match_unit,
        cache.attention_block_size,
        Budget(cache.num_blocks, cache.mamba_num_blocks),
        spec.concurrency,
        cache.eagle,
        mamba_block_size=cache.mamba_block_size,
    )


def workload_summary(spec: BenchmarkSpec, workload: Workload) -> dict:
    return {
        "kind": workload.kind,
        "params": spec.workload.model_dump(mode="json"),
        "num_requests": workload.num_requests,
        "num_prompt_tokens": workload.num_prompt_tokens,
        "num_pins": len(workload.pins),
    }


def warm_up(spec: BenchmarkSpec) -> None:
    """One throwaway request on an engine of its own, so the first mode's TTFT does not pay
    the model's one-time costs (allocator, kernels) and no mode's cache holds it."""
    engine = build_engine(spec, "off")
    length = min(spec.geometry.max_num_batched_tokens, 256)
    engine.generate([[token % 256 for token in range(length)]], SamplingParams(max_tokens=2))


def build_engine(
    spec: BenchmarkSpec, mode: str, meter: StepMeter | None = None, **cache_options
) -> Engine:
    """The engine of one mode; `cache_options` override the mode's `CacheConfig` fields."""
    cache = spec.geometry.cache_config(**{**MODE_CACHE_OPTIONS[mode], **cache_options})
    model = spec.model.to_model_config()
    runner = make_runner(spec.runner, cache, model)
    if meter is not None:
        runner = MeteredRunner(runner, meter)
    engine = Engine(
        cache, spec.geometry.scheduler_config(), model, runner=runner, engine_id=f"bench-{mode}"
    )
    if meter is not None:
        meter.pools = engine.scheduler.coordinator.pools
        engine.step_listeners.append(meter.after_step)
    return engine


class StepMeter:
    """Forward passes, the peak of blocks not free, and finished requests, step by step.

    Blocks are counted when the runner executes a step: after the scheduler allocated the
    step's blocks and before it frees those of requests that finish in it.
    """

    def __init__(self, on_done: Callable[[int], None]) -> None:
        self.num_forward_passes = 0
        self.peak_blocks_used = dict.fromkeys(GROUPS, 0)
        self.num_done = 0
        self.on_done = on_done
        self.pools: dict[str, BlockPool] = {}

    def before_forward(self, out: SchedulerOutput) -> None:
        if out.chunks:
            self.num_forward_passes += 1
        for group, pool in self.pools.items():
            used = pool.num_blocks - pool.num_free
            if used > self.peak_blocks_used[group]:
                self.peak_blocks_used[group] = used

    def after_step(self, engine: Engine) -> None:
        if engine.stats.num_requests != self.num_done:
            self.num_done = engine.stats.num_requests
            self.on_done(self.num_done)


class MeteredRunner(Runner):
    """A runner that lets a `StepMeter` see every step before running it unchanged."""

    def __init__(self, inner: Runner, meter: StepMeter) -> None:
        self.inner = inner
        self.meter = meter
        self.medium = inner.medium
        self.kind = inner.kind

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.meter.before_forward(out)
        return self.inner.execute(out)

    def zero_blocks(self, group: str, block_ids: list[int]) -> None:
        self.inner.zero_blocks(group, block_ids)

    def copy_block(self, copy: BlockCopy) -> None:
        self.inner.copy_block(copy)

    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        return self.inner.forward(chunks)

    def save_unit(self, save: UnitSave) -> TierUnit:
        return self.inner.save_unit(save)

    def load_unit(self, load: UnitLoad) -> None:
        self.inner.load_unit(load)


def run_mode(
    spec: BenchmarkSpec, mode: str, items: list[TraceItem], on_done: Callable[[int], None]
) -> dict:
    meter = StepMeter(on_done)
    engine = build_engine(spec, mode, meter)
    started = time.perf_counter()
    try:
        records, summary = replay(engine, items, spec.concurrency)
    except ValueError as exc:
        raise BenchmarkError(f"mode {mode}: {exc}") from exc
    wall_s = time.perf_counter() - started
    requests = [r for r in records if r.get("type") == "request"]
    pins = [r for r in records if r.get("type") == "pin"]
    ttfts = [r["ttft_s"] for r in requests if r["ttft_s"] is not None]
    num_output = sum(len(r["output_token_ids"]) for r in requests)
    row = {
        "mode": mode,
        "num_requests": summary.num_requests,
        "num_prompt_tokens": summary.num_prompt_tokens,
        "num_cached_tokens": summary.num_cached_tokens,
        "hit_rate": summary.hit_rate,
        "oracle_hit_rate": 0.0,
        "computed_tokens": summary.num_computed_tokens,
        "forward_passes": meter.num_forward_passes,
        "cow_copies": sum(len(r["cow_copies"]) for r in requests),
        **timings(ttfts, summary.num_prompt_tokens, num_output, wall_s),
        "num_steps": summary.num_steps,
        "num_preemptions": summary.num_preemptions,
        "peak_blocks_used": dict(meter.peak_blocks_used),
    }
    if pins:
        row["pins"] = {
            "num_materialized": sum(p["state"] == "materialized" for p in pins),
            "num_failed": sum(p["state"] == "failed" for p in pins),
            "reasons": sorted({p["reason"] for p in pins if p["reason"]}),
        }
    return row


def timings(ttfts: list[float], num_prompt: int, num_output: int, wall_s: float) -> dict:
    """A row's TTFT median and p99, throughput (prompt + output tokens per second of wall
    time, and output alone) and wall time."""
    ttfts = sorted(ttfts)
    return {
        "ttft_median_s": statistics.median(ttfts) if ttfts else 0.0,
        "ttft_p99_s": percentile(ttfts, 0.99),
        "throughput_tok_s": (num_prompt + num_output) / wall_s if wall_s else 0.0,
        "output_tok_s": num_output / wall_s if wall_s else 0.0,
        "num_output_tokens": num_output,
        "wall_s": wall_s,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of ascending values (0.0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * q // 1))
    return sorted_values[int(rank) - 1]
