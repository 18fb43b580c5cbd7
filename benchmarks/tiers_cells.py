"""The cells of `benchmarks/tiers.py`: a workload replayed by Junction's engine (the null runner)
with device pools at a share of its working set, over a host tier of a multiple of the device's
bytes, with or without a disk tier, and once with an engine restart halfway.

Bytes are the model's (`engine.setup.footprint`, the built-in model): the device holds
`num_blocks * Ba` tokens of keys and values and `num_mamba_blocks` states, and the null runner
sizes each unit it saves by the same footprint (expanded tensors: the host tier counts the bytes
without holding them, the disk tier writes them). A restart is a clean stop of the first engine
(`Engine.close`: the device's states and host memory's units go to disk) and a second engine on
the same disk directory replaying the second half of the trace: the device and host memory start
empty, the disk holds what the first engine held.

The multi-tenant agentic trace: `num_tenants` tenants, each with its own cache salt, each
running agent sessions over one of three system prompts of 700-3300 tokens (seeded lengths);
a session's step is its previous step, an action and a tool's output. Sessions of every tenant
are interleaved, so a tenant's prompt is read again after the other tenants' work.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks.pressure_cells import (
    BLOCK_SIZE,
    FAMILIES,
    MAMBA_BLOCK_SIZE,
    UNIT,
    family_requests,
    level_budgets,
)
from engine.config import CacheConfig, ModelConfig, SchedulerConfig, TierConfig
from engine.engine import Engine
from engine.events import NullSink
from engine.request import SamplingParams
from engine.setup.footprint import footprint
from engine.tiers.tiering import TieringStats
from engine.traces.replay import replay
from engine.traces.trace import TraceRequest, parse_line
from workloads import oracle
from workloads.base import SegmentSource, interleave_sessions, request_line
from workloads.bound import Budget

LEVEL = 0.25  # the device pools' share of the working set
HOST_MULTIPLES = (0, 2, 8)  # host tier bytes over the device pools' bytes
DISK_MULTIPLE = 16  # disk tier bytes over the device pools' bytes, when on
RESTART_WINDOW = 100  # requests after the restart whose hit rate is compared
TENANTS = "multi-tenant agents"

#: the multi-tenant agentic trace (`tenant_requests`)
TENANT_PARAMS = {
    "num_tenants": 6,
    "sessions_per_tenant": 5,
    "num_steps": 5,
    "task_len": 150,
    "tool_output_len": 200,
    "action_len": 30,
    "seed": 46,
}


def tenant_requests(
    num_tenants: int,
    sessions_per_tenant: int,
    num_steps: int,
    task_len: int,
    tool_output_len: int,
    action_len: int,
    seed: int,
) -> list[TraceRequest]:
    """The multi-tenant agentic trace (the module's docstring), in arrival order."""
    source = SegmentSource(seed)
    rng = np.random.default_rng([seed, 46])
    systems = [source.new(int(n)) for n in rng.integers(700, 3301, 3)]
    sessions: list[list[dict]] = []
    for tenant in range(num_tenants):
        salt = f"tenant-{tenant}"
        system = systems[tenant % len(systems)]
        for session in range(sessions_per_tenant):
            context = [system, source.new(task_len)]
            steps = []
            for step in range(num_steps):
                if step:
                    context = [*context, source.new(action_len), source.new(tool_output_len)]
                line = request_line(f"t{tenant}-a{session}-s{step}", context, action_len)
                steps.append({**line, "cache_salt": salt})
            sessions.append(steps)
    lines = interleave_sessions(sessions)
    items = [parse_line(json.dumps(line), number) for number, line in enumerate(lines, 1)]
    return [item for item in items if isinstance(item, TraceRequest)]


def workloads(quick: bool = False) -> dict[str, list[TraceRequest]]:
    """The pressure families and the multi-tenant trace; `quick` keeps each one's first
    quarter (the tenant trace 2 sessions a tenant)."""
    found = {name: family_requests(name) for name in FAMILIES}
    params = dict(TENANT_PARAMS)
    if quick:
        params["sessions_per_tenant"] = 2
        found = {name: requests[: len(requests) // 4] for name, requests in found.items()}
    found[TENANTS] = tenant_requests(**params)
    return found


# ---------------------------------------------------------------------- sizes and rates
def level_budget(
    requests: list[TraceRequest], concurrency: int, level: float = LEVEL
) -> tuple[Budget, bool]:
    """The pools at `level` of the working set (`pressure_cells.level_budgets`), and whether
    the engine's floor raised them."""
    for share, budget, is_floored in level_budgets(requests, concurrency):
        if share == level:
            return budget, is_floored
    raise ValueError(f"no level {level} in pressure_cells.LEVELS")


def device_bytes(budget: Budget, model: ModelConfig | None = None) -> int:
    """The model's bytes in the device pools: attention blocks of `Ba` tokens, one state a
    Mamba block."""
    found = footprint(model or ModelConfig())
    return (
        budget.num_blocks * BLOCK_SIZE * found.attention_bytes_per_token
        + budget.num_mamba_blocks * found.mamba_bytes_per_slot
    )


class Rates(NamedTuple):
    prefill_tokens_per_s: float  # the torch runner's built-in model on one CPU prompt
    host_bytes_per_s: float  # `measure_host_bandwidth`
    disk_bytes_per_s: float  # `measure_disk_bandwidth` in the disk tier's temp directory


def measure_prefill_rate(num_tokens: int = 512, repeats: int = 5) -> float:
    """Tokens per second of prefilling a fresh `num_tokens` prompt with the torch runner's
    built-in model (the model whose footprint sizes the units), the fastest of `repeats`
    (the fastest, as other work on a shared machine only ever slows a run down)."""
    engine = Engine(
        CacheConfig(block_size=BLOCK_SIZE, mamba_block_size=MAMBA_BLOCK_SIZE),
        runner="torch",
        sink=NullSink(),
    )
    rng = np.random.default_rng(512)
    vocab = ModelConfig().vocab_size
    engine.generate([rng.integers(0, vocab, 64).tolist()], SamplingParams(max_tokens=1))  # warm
    best = math.inf
    for _ in range(repeats):
        prompt = rng.integers(0, vocab, num_tokens).tolist()
        started = time.perf_counter()
        engine.generate([prompt], SamplingParams(max_tokens=1))
        best = min(best, time.perf_counter() - started)
    return num_tokens / best


def measure_rates(directory: str) -> Rates:
    from engine.tiers.setup import measure_disk_bandwidth, measure_host_bandwidth

    return Rates(
        measure_prefill_rate(), measure_host_bandwidth(), measure_disk_bandwidth(directory)
    )


# ---------------------------------------------------------------------- the runs
class TierRun(NamedTuple):
    hit_tokens: int
    prompt_tokens: int
    records: list[dict]  # one per request, in trace order
    stats: TieringStats | None  # None without tiers


def tier_config(
    device: int, host_multiple: int, disk_dir: str | None, rates: Rates | None
) -> TierConfig:
    return TierConfig(
        host_cache_bytes=host_multiple * device,
        disk_cache_dir=disk_dir,
        disk_cache_bytes=DISK_MULTIPLE * device if disk_dir is not None else 0,
        host_bytes_per_s=None if rates is None else rates.host_bytes_per_s,
        disk_bytes_per_s=None if rates is None else rates.disk_bytes_per_s,
        prefill_tokens_per_s=None if rates is None else rates.prefill_tokens_per_s,
    )


def run_engine(
    requests: list[TraceRequest],
    budget: Budget,
    concurrency: int,
    tiers: TierConfig,
    close: bool = False,
) -> TierRun:
    """Replay `requests` through a fresh engine (the null runner, default policy) with
    `tiers` under pools of `budget`; `close`: a clean stop after it (`Engine.close`: the
    device's states and host memory's units to disk)."""
    cache = CacheConfig(
        block_size=BLOCK_SIZE,
        mamba_block_size=MAMBA_BLOCK_SIZE,
        prefix_match_unit=UNIT,
        num_blocks=budget.num_blocks,
        num_mamba_blocks=budget.num_mamba_blocks,
    )
    engine = Engine(
        cache, SchedulerConfig(), runner="null", sink=NullSink(), engine_id="tiers", tiers=tiers
    )
    records, summary = replay(engine, requests, concurrency)
    if close:
        engine.close()
    tiering = engine.scheduler.tiering
    return TierRun(
        summary.num_cached_tokens,
        summary.num_prompt_tokens,
        [r for r in records if r["type"] == "request"],
        None if tiering is None else tiering.stats(),
    )


class Cell(NamedTuple):
    workload: str
    concurrency: int
    host_multiple: int
    is_disk: bool
    num_prompt_tokens: int
    oracle_tokens: int
    hit_tokens: int
    host_in: int  # bytes into host memory (puts and promotions)
    host_out: int  # bytes loaded from host memory
    disk_in: int
    disk_out: int
    num_loads: int
    num_refused_slow: int
    modelled_s: float  # (prompt - hit) / prefill rate + loaded bytes / bandwidths


def modelled_seconds(
    prompt_tokens: int, hit_tokens: int, host_out: int, disk_out: int, rates: Rates
) -> float:
    return (
        (prompt_tokens - hit_tokens) / rates.prefill_tokens_per_s
        + host_out / rates.host_bytes_per_s
        + disk_out / rates.disk_bytes_per_s
    )


def run_cell(
    workload: str,
    requests: list[TraceRequest],
    budget: Budget,
    concurrency: int,
    host_multiple: int,
    is_disk: bool,
    rates: Rates,
    oracle_tokens: int,
) -> tuple[Cell, TierRun]:
    device = device_bytes(budget)
    with tempfile.TemporaryDirectory(prefix="junction-tiers-") as tmp:
        tiers = tier_config(device, host_multiple, tmp if is_disk else None, rates)
        run = run_engine(requests, budget, concurrency, tiers)
    stats = run.stats
    host = None if stats is None else stats.stack.host
    disk = None if stats is None else stats.stack.disk
    host_in, host_out = (0, 0) if host is None else (host.bytes_in, host.bytes_out)
    disk_in, disk_out = (0, 0) if disk is None else (disk.bytes_in, disk.bytes_out)
    cell = Cell(
        workload,
        concurrency,
        host_multiple,
        is_disk,
        run.prompt_tokens,
        oracle_tokens,
        run.hit_tokens,
        host_in,
        host_out,
        disk_in,
        disk_out,
        0 if stats is None else stats.num_loads,
        0 if stats is None else stats.num_refused_slow,
        modelled_seconds(run.prompt_tokens, run.hit_tokens, host_out, disk_out, rates),
    )
    return cell, run


def hit_rate(records: list[dict]) -> float:
    prompt = sum(r["num_prompt_tokens"] for r in records)
    return sum(r["num_cached_tokens"] for r in records) / prompt if prompt else 0.0


class Restart(NamedTuple):
    workload: str
    concurrency: int
    host_multiple: int
    num_before: int  # requests replayed before the restart
    before_rate: float  # hit rate of every request before the restart
    last_before_rate: float  # of the last `RESTART_WINDOW` before it
    after_rate: float  # of the first `RESTART_WINDOW` after it
    unbroken_rate: float  # of the same requests in a run without the restart
    disk_units_at_restart: int  # units the second engine found on disk
    after_loaded_tokens: int  # tokens the second engine's hits read from the tiers
    after_disk_out: int  # bytes it read from disk


def run_restart(
    workload: str,
    requests: list[TraceRequest],
    budget: Budget,
    concurrency: int,
    host_multiple: int,
    rates: Rates,
    unbroken: TierRun,
) -> Restart:
    """The first half through one engine, stopped cleanly, the second through a new one on
    the same disk directory; `unbroken` is the same cell's run without the restart."""
    half = len(requests) // 2
    device = device_bytes(budget)
    with tempfile.TemporaryDirectory(prefix="junction-tiers-restart-") as tmp:
        tiers = tier_config(device, host_multiple, tmp, rates)
        before = run_engine(requests[:half], budget, concurrency, tiers, close=True)
        num_units = sum(1 for p in Path(tmp).iterdir() if p.suffix == ".unit")
        after = run_engine(requests[half:], budget, concurrency, tiers)
    window = after.records[:RESTART_WINDOW]
    stats = after.stats
    assert stats is not None
    return Restart(
        workload,
        concurrency,
        host_multiple,
        half,
        hit_rate(before.records),
        hit_rate(before.records[-RESTART_WINDOW:]),
        hit_rate(window),
        hit_rate(unbroken.records[half : half + len(window)]),
        num_units,
        stats.num_loaded_tokens,
        0 if stats.stack.disk is None else stats.stack.disk.bytes_out,
    )


class Workload(NamedTuple):
    name: str
    concurrency: int
    num_requests: int
    budget: Budget
    is_floored: bool
    device_bytes: int
    oracle_tokens: int
    whole_tokens: int  # the engine's hit tokens, no tiers, pools of the whole working set
    cells: list[Cell]
    restarts: list[Restart]


def run_workload(
    name: str,
    requests: list[TraceRequest],
    concurrency: int,
    rates: Rates,
    advance=lambda description: None,
) -> Workload:
    """Every cell of one workload: host 0x/2x/8x, disk off and on, and the restarts (disk on,
    each host size). `advance` is called with a description before each run."""
    budget, is_floored = level_budget(requests, concurrency)
    best = oracle(requests, UNIT).num_oracle_tokens
    advance(f"{name}: pools of the whole working set")
    whole = run_engine(
        requests, level_budget(requests, concurrency, 1.0)[0], concurrency, TierConfig()
    )
    cells, restarts = [], []
    for host_multiple in HOST_MULTIPLES:
        for is_disk in (False, True):
            advance(f"{name}: host {host_multiple}x, disk {'on' if is_disk else 'off'}")
            cell, run = run_cell(
                name, requests, budget, concurrency, host_multiple, is_disk, rates, best
            )
            cells.append(cell)
            if is_disk:
                advance(f"{name}: host {host_multiple}x, disk on, restart")
                restarts.append(
                    run_restart(name, requests, budget, concurrency, host_multiple, rates, run)
                )
    return Workload(
        name,
        concurrency,
        len(requests),
        budget,
        is_floored,
        device_bytes(budget),
        best,
        whole.hit_tokens,
        cells,
        restarts,
    )
