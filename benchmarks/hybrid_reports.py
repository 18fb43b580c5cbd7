"""Two vLLM user reports on hybrid prefix caching, reproduced: Junction beside vLLM in one run.

The reports are on Qwen3.5 (Gated DeltaNet + attention; vLLM caches the DeltaNet state as it
caches a Mamba state, "align" mode, a checkpoint only where a prefill chunk ends):

A. "Prefix caching is ineffective on Mamba-2/GDN hybrid": an exact resend of a 561-token
   prompt hits 0 tokens.
B. "Hybrid-model prefix caching silently drops to 0% when the align-mode Mamba checkpoint
   lands in request-unique tokens" (Qwen3.5-4B, state block 528): 64 requests of 2200 tokens,
   one shared prefix and a unique rest each. 1600 shared / 600 unique hits 52 of 64 requests;
   1500 / 700 hits 0 of 64 and doubles TTFT.

Geometry (docs/rules.md's words): Ba 16, Bm 528, U 16, a 2048-token step budget (which puts a
2200-token prompt's first chunk end, vLLM's only checkpoint below 2112, at 1584: inside the
1600-token prefix, past the 1500-token one). Every scenario runs through Junction's engine with
its defaults (the ledger runner: every reused block is checked against the reader's prefix;
or `--runner torch --model DIR`: a real checkpoint, with cache-off outputs as the reference)
and through vLLM 0.33's own scheduler (the peer, `make peer`), with the same token ids, pools
and arrival order, twice: at this geometry, and with attention blocks of Bm (what vLLM's align
mode gives a real model; U then defaults to Bm). If vLLM refuses the first, the refusal is
printed and the row runs with Ba = Bm. Per scenario: what the report says, requests that hit,
requests at the oracle (the shared prefix floored to U; for the resend, `floor((P - 1) / U) *
U`), mean hit and mean prefill tokens computed per request (what TTFT follows). With the torch
runner also the median TTFT, cache on and off (noisy on a shared CPU), and whether the outputs
equal cache off's; the command exits 1 if they do not.

vLLM 0.33 no longer shows what the reports describe: it keeps the block-floored junction state
(the second request of a family makes it) and stops a chunk at the resend-safe position, so
its 1500/700 split hits 1056 and the resend 560 (528 with Ba = Bm).

`--scale S` divides every length, Bm and the budget by S (Bm / S must stay a multiple of U:
S in 1, 3, 11, 33 at the defaults), for the torch runner on a CPU; `--requests` sends fewer.
`--seed` is the built-in model's (`junction replay`'s model options); the prompts are seed 0.

    make peer && .venv/bin/python benchmarks/hybrid_reports.py
    .venv/bin/python benchmarks/hybrid_reports.py --runner torch --model DIR --scale 11 \\
        --requests 8 --max-tokens 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peer.client import (  # noqa: E402
    PeerError,
    PeerProcess,
    expanded_request,
    peer_python,
)
from engine.config import CacheConfig, ModelConfig, SchedulerConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.setup.options import add_model_options, model_config_from_args  # noqa: E402
from engine.traces.replay import replay  # noqa: E402
from engine.traces.trace import TraceRequest  # noqa: E402
from workloads import OracleResult, build_workload, oracle  # noqa: E402

#: the reports' numbers, before `--scale`
PROMPT_LEN = 2200
SPLITS = ((1600, 600), (1500, 700))  # shared, unique
RESEND_LEN = 561
NUM_REQUESTS = 64
NUM_SENDS = 4  # the first send and three resends
REPORTED_B = ("52/64 hit", "0/64 hit, TTFT x2")


@dataclass(frozen=True)
class Geometry:
    """The cache and step geometry both engines get."""

    block_size: int = 16  # Ba
    mamba_block_size: int = 528  # Bm
    prefix_match_unit: int = 16  # U
    max_num_batched_tokens: int = 2048

    def scaled(self, scale: int) -> Geometry:
        """Bm and the budget divided by `scale`; `ValueError` unless `scale` divides Bm."""
        if scale < 1 or self.mamba_block_size % scale:
            raise ValueError(
                f"--scale {scale} must divide the Mamba block size {self.mamba_block_size}"
            )
        return replace(
            self,
            mamba_block_size=self.mamba_block_size // scale,
            max_num_batched_tokens=max(self.max_num_batched_tokens // scale, 1),
        )

    def cache_config(self, pools: Pools, **policy) -> CacheConfig:
        """Junction's cache: this geometry, the pools, and `policy` over the defaults."""
        return CacheConfig(
            block_size=self.block_size,
            mamba_block_size=self.mamba_block_size,
            prefix_match_unit=self.prefix_match_unit,
            num_blocks=pools.num_blocks,
            num_mamba_blocks=pools.num_mamba_blocks,
            **policy,
        )

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(max_num_batched_tokens=self.max_num_batched_tokens)

    def peer_geometry(self, pools: Pools) -> dict:
        """The peer's geometry dict (its one pool holds both groups' blocks)."""
        return {
            "block_size": self.block_size,
            "mamba_block_size": self.mamba_block_size,
            "prefix_match_unit": self.prefix_match_unit,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "num_blocks": pools.num_blocks,
            "num_mamba_blocks": pools.num_mamba_blocks,
        }


class Pools(NamedTuple):
    num_blocks: int  # attention blocks
    num_mamba_blocks: int  # Mamba state slots


@dataclass(frozen=True)
class Scenario:
    """One report's case: a workload of `workloads` (kinds `seed_shared_prefix` and
    `seed_eagle_resend`; the resend's geometry here has no EAGLE)."""

    name: str
    workload: dict
    reported: str  # what the report says vLLM hit

    def requests(self) -> list[TraceRequest]:
        items = build_workload(self.workload).items()
        return [item for item in items if isinstance(item, TraceRequest)]

    def describe(self) -> str:
        """The lengths as run (after `--scale`)."""
        w = self.workload
        if "shared_len" in w:
            return f"P {w['prompt_len']}, shared {w['shared_len']}, x{w['num_requests']}"
        return f"P {w['prompt_len']}, x{w['num_sends']}"

    def pools(self, geometry: Geometry) -> Pools:
        """Enough attention blocks that nothing is evicted, and a few state slots more than
        each request's block boundaries."""
        requests = self.requests()
        tokens = sum(len(r.token_ids) + r.max_tokens for r in requests)
        longest = max(len(r.token_ids) for r in requests)
        per_request = -(-longest // geometry.mamba_block_size) + 4
        return Pools(
            num_blocks=tokens // geometry.block_size + 2 * len(requests) + 16,
            num_mamba_blocks=per_request * len(requests),
        )


def scaled_len(length: int, scale: int) -> int:
    return max(round(length / scale), 1)


def scenarios(
    scale: int = 1,
    num_requests: int = NUM_REQUESTS,
    num_sends: int = NUM_SENDS,
    max_tokens: int = 1,
    seed: int = 0,
) -> list[Scenario]:
    """The reports' three cases: the two splits of B, then A's resend; lengths over `scale`."""
    prompt_len = scaled_len(PROMPT_LEN, scale)
    cases = [
        Scenario(
            f"B {shared}/{unique}",
            {
                "kind": "seed_shared_prefix",
                "seed": seed,
                "num_requests": num_requests,
                "prompt_len": prompt_len,
                "shared_len": min(scaled_len(shared, scale), prompt_len - 1),
                "output_len": max_tokens,
            },
            reported,
        )
        for (shared, unique), reported in zip(SPLITS, REPORTED_B, strict=True)
    ]
    cases.append(
        Scenario(
            f"A resend {RESEND_LEN}",
            {
                "kind": "seed_eagle_resend",
                "seed": seed,
                "prompt_len": scaled_len(RESEND_LEN, scale),
                "num_sends": num_sends,
                "output_len": max_tokens,
            },
            "0 hit tokens",
        )
    )
    return cases


# ---------------------------------------------------------------------- the runs
def run_junction(
    scenario: Scenario,
    geometry: Geometry,
    runner: str = "ledger",
    model: ModelConfig | None = None,
    concurrency: int = 1,
    on_step: Callable[[Engine], None] | None = None,
    **policy,
) -> list[dict]:
    """The scenario through Junction's engine: its defaults, `policy` over them (e.g.
    `enable_prefix_caching=False` for the cache-off reference). One record a request;
    `on_step` runs after every step (tests check invariants there)."""
    cache = geometry.cache_config(scenario.pools(geometry), **policy)
    engine = Engine(cache, geometry.scheduler_config(), model, runner=runner)
    records, _ = replay(engine, scenario.requests(), concurrency, on_step)
    return records


class PeerRun(NamedTuple):
    records: list[dict]
    geometry: dict  # what vLLM ran
    refusal: str | None  # what vLLM said of the asked geometry, when it refused it


def run_vllm(
    peer: PeerProcess,
    scenario: Scenario,
    geometry: Geometry,
    concurrency: int = 1,
    align_blocks: bool = False,
) -> PeerRun:
    """The scenario through vLLM's scheduler at `geometry`, or with `align_blocks` at what its
    align mode gives a real model: attention blocks of Bm (and U its default, gcd = Bm). If
    vLLM refuses `geometry`, it runs as with `align_blocks` and the refusal is kept."""
    expanded = [expanded_request(r) for r in scenario.requests()]
    asked = geometry.peer_geometry(scenario.pools(geometry))
    aligned = {
        **asked,
        "block_size": geometry.mamba_block_size,
        "prefix_match_unit": None,
        "num_blocks": asked["num_blocks"] * geometry.block_size // geometry.mamba_block_size
        + 2 * len(expanded),
    }
    if align_blocks:
        return PeerRun(peer.replay(expanded, aligned, concurrency), aligned, None)
    try:
        return PeerRun(peer.replay(expanded, asked, concurrency), asked, None)
    except PeerError as exc:
        return PeerRun(peer.replay(expanded, aligned, concurrency), aligned, str(exc))


# ---------------------------------------------------------------------- the figures
class Figures(NamedTuple):
    """One engine's figures on one scenario."""

    num_requests: int
    num_hit: int  # requests with a hit > 0
    num_at_oracle: int  # requests whose hit is the oracle's (0 where the oracle is 0)
    mean_hit_tokens: float
    mean_prefill_tokens: float  # prompt tokens computed per request


def oracle_of(scenario: Scenario, geometry: Geometry) -> OracleResult:
    return oracle(scenario.requests(), geometry.prefix_match_unit)


def figures(records: list[dict], best: OracleResult) -> Figures:
    hits = [r["num_cached_tokens"] for r in records]
    return Figures(
        num_requests=len(records),
        num_hit=sum(1 for h in hits if h > 0),
        num_at_oracle=sum(
            1 for h, o in zip(hits, best.hits, strict=True) if h == o.num_oracle_tokens
        ),
        mean_hit_tokens=statistics.fmean(hits),
        mean_prefill_tokens=statistics.fmean(r["num_computed_tokens"] for r in records),
    )


def oracle_figures(best: OracleResult) -> Figures:
    hits = [h.num_oracle_tokens for h in best.hits]
    return Figures(
        num_requests=len(hits),
        num_hit=sum(1 for h in hits if h > 0),
        num_at_oracle=len(hits),
        mean_hit_tokens=statistics.fmean(hits),
        mean_prefill_tokens=statistics.fmean(
            h.num_prompt_tokens - h.num_oracle_tokens for h in best.hits
        ),
    )


def median_ttft_ms(records: list[dict]) -> float:
    return statistics.median(r["ttft_s"] for r in records) * 1e3


# ---------------------------------------------------------------------- the command
def add_row(table: Table, scenario: str, engine: str, f: Figures, extra: list[str]) -> None:
    table.add_row(
        scenario,
        engine,
        f"{f.num_hit}/{f.num_requests}",
        f"{f.num_at_oracle}/{f.num_requests}",
        f"{f.mean_hit_tokens:.1f}",
        f"{f.mean_prefill_tokens:.1f}",
        *extra,
    )


def report(args: argparse.Namespace, peer: PeerProcess | None, console: Console) -> bool:
    """Runs every scenario on both engines and prints the table; False if Junction's outputs
    with the cache on differ from cache off (torch runner)."""
    geometry = Geometry(
        args.block_size, args.mamba_block_size, args.prefix_match_unit, args.max_num_batched_tokens
    ).scaled(args.scale)
    is_torch = args.runner == "torch"
    model = model_config_from_args(args) if is_torch else None
    cases = scenarios(args.scale, args.requests, args.sends, args.max_tokens)
    vllm = f"vLLM {peer.version}" if peer is not None else "vLLM (no peer)"
    table = Table(
        title=f"Junction ({args.runner} runner, defaults) beside {vllm}: Ba {geometry.block_size}, "
        f"Bm {geometry.mamba_block_size}, U {geometry.prefix_match_unit}, budget "
        f"{geometry.max_num_batched_tokens}, concurrency {args.concurrency}"
        + (f", scale 1/{args.scale}" if args.scale > 1 else "")
    )
    columns = ["scenario", "engine", "requests hit", "at the oracle", "mean hit", "mean prefill"]
    if is_torch:
        columns += ["median TTFT ms", "cache off", "outputs = off"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("scenario", "engine") else "right")
    blank = [""] * (len(columns) - 6)
    notes: list[str] = []
    all_equal = True
    if is_torch:  # one untimed run first: the allocator, kernels and threads warm up
        run_junction(cases[0], geometry, args.runner, model, enable_prefix_caching=False)
    for scenario in cases:
        best = oracle_of(scenario, geometry)
        label = f"{scenario.name} ({scenario.describe()})"
        table.add_row(label, f"reported: {scenario.reported}", *[""] * (len(columns) - 2))
        add_row(table, "", "oracle", oracle_figures(best), blank)
        ours = run_junction(scenario, geometry, args.runner, model, args.concurrency)
        extra = blank
        if is_torch:
            off = run_junction(
                scenario,
                geometry,
                args.runner,
                model,
                args.concurrency,
                enable_prefix_caching=False,
            )
            equal = [r["output_token_ids"] for r in ours] == [r["output_token_ids"] for r in off]
            all_equal &= equal
            extra = [
                f"{median_ttft_ms(ours):.1f}",
                f"{median_ttft_ms(off):.1f}",
                "yes" if equal else "NO",
            ]
        add_row(table, "", "Junction", figures(ours, best), extra)
        rows = {"Junction": ours}
        if peer is not None:
            for align_blocks in (False, True):
                run = run_vllm(peer, scenario, geometry, args.concurrency, align_blocks)
                ran = run.geometry
                unit = ran["prefix_match_unit"] or ran["block_size"]
                name = f"{vllm}, Ba {ran['block_size']} U {unit}"
                add_row(table, "", name, figures(run.records, best), blank)
                rows[name] = run.records
                if run.refusal is not None:
                    notes.append(
                        f"{scenario.name}: vLLM refused Ba {geometry.block_size} "
                        f"({run.refusal}); ran Ba {ran['block_size']} instead"
                    )
        if args.per_request:
            for name, records in rows.items():
                hits = [r["num_cached_tokens"] for r in records]
                notes.append(f"{scenario.name}, {name}: hits {hits}")
    console.print(table)
    for note in notes:
        console.print(note)
    return all_equal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", choices=("ledger", "torch", "null"), default="ledger")
    parser.add_argument("--scale", type=int, default=1, help="divide lengths, Bm and budget by S")
    parser.add_argument("--requests", type=int, default=NUM_REQUESTS, help="requests of B")
    parser.add_argument("--sends", type=int, default=NUM_SENDS, help="sends of A's prompt")
    parser.add_argument("--max-tokens", type=int, default=1, help="output tokens a request")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--block-size", type=int, default=Geometry.block_size)
    parser.add_argument("--mamba-block-size", type=int, default=Geometry.mamba_block_size)
    parser.add_argument("--prefix-match-unit", type=int, default=Geometry.prefix_match_unit)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=Geometry.max_num_batched_tokens
    )
    parser.add_argument("--no-vllm", action="store_true", help="Junction only")
    parser.add_argument("--per-request", action="store_true", help="print every request's hit")
    add_model_options(parser)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.requests < 2 or args.sends < 2:
        parser.error("--requests and --sends must be at least 2 (a first request, then hits)")
    if args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1, got {args.concurrency}")
    try:
        geometry = Geometry(
            args.block_size,
            args.mamba_block_size,
            args.prefix_match_unit,
            args.max_num_batched_tokens,
        ).scaled(args.scale)
        geometry.cache_config(Pools(1, 1))
        geometry.scheduler_config()
    except ValueError as exc:
        parser.error(str(exc))
    console = Console(width=160)
    if args.no_vllm:
        return 0 if report(args, None, console) else 1
    if peer_python() is None:
        print(
            "hybrid_reports: no peer environment (.venv-peer): run `make peer`, or --no-vllm",
            file=sys.stderr,
        )
        return 2
    with PeerProcess() as peer:
        return 0 if report(args, peer, console) else 1


if __name__ == "__main__":
    sys.exit(main())
