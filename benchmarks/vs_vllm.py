"""Junction beside vLLM 0.33, in one run: hits per request, then hashing, lookup and replay times.

vLLM runs in its own environment (`make peer`) as a long-lived subprocess
(`benchmarks/peer/vllm_replay.py serve`); both sides get the same token ids, the same geometry
and the same arrival order. Every ratio printed is Junction's median over vLLM's median, both
measured in this run, their rounds alternating so the machine's noise falls on both alike.

1. Hits: the trace (or a generated workload) through Junction with its defaults and with
   partial hits off, and through vLLM with partial hits on and off; every request's hit and the
   totals against the oracle, and every request where Junction hits less than vLLM.
2. Hashing one 8192-token prompt at U 16.
3. One lookup of an 8192-token prompt after the cache was warmed with two prompts that share
   its prefix: a prefix that ends inside an attention block (Ba 64, Bm 512, U 16; and Ba = Bm =
   4416, U 64) next to one that ends on a block boundary. Hashing is not timed here.
4. The replay loop on 500 requests (1.81M prompt tokens): Junction's null runner with no event
   sink, and with every event built and drained each step (what the publisher takes), and its
   ledger runner, against vLLM's `KVCacheManager` driven by a minimal step loop (the peer's
   `manager_replay`: allocation, lookup, caching and freeing, no `Scheduler`) and against its
   full scheduler loop (`Scheduler.schedule` and `update_from_output`), request hashing
   included on both, with a faked model. The two vLLM loops' hits and chunks are compared.

    make peer && .venv/bin/python benchmarks/vs_vllm.py [--rounds 3] [--trace T.jsonl]
    .venv/bin/python benchmarks/vs_vllm.py --timings-only --replay-only  # section 4 alone
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peer.client import PeerProcess, expanded_request, peer_python  # noqa: E402
from engine.config import CacheConfig, SchedulerConfig, TierConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.events import ListSink, NullSink  # noqa: E402
from engine.hashing import hash_prefix  # noqa: E402
from engine.request import SamplingParams  # noqa: E402
from engine.traces.replay import replay  # noqa: E402
from engine.traces.trace import TraceRequest, read_trace  # noqa: E402
from workloads import build_workload, oracle  # noqa: E402

HIT_WORKLOAD = {
    "kind": "generated_shared_prefix",
    "num_groups": 8,
    "prompts_per_group": 8,
    "system_prompt_len": 1000,
    "question_len": 200,
    "output_len": 8,
}
#: the step loop with a host tier: the null runner's units hold no values, so 8 GiB costs nothing
IDLE_TIERS = TierConfig(host_cache_bytes=8 << 30)
ROOMY_BLOCKS = 1 << 17  # attention blocks (and state slots) that hold the whole loop
LOOP_WORKLOAD = {  # 500 requests of 3620 tokens: 1.81M prompt tokens
    "kind": "generated_shared_prefix",
    "num_groups": 25,
    "prompts_per_group": 20,
    "system_prompt_len": 3500,
    "question_len": 120,
    "output_len": 16,
}
LOOKUP_CASES = [  # name, geometry, shared prefix
    ("Ba 64 / Bm 512 / U 16, prefix ends inside a block", (64, 512, 16), 4000),
    ("Ba 64 / Bm 512 / U 16, prefix ends on a boundary", (64, 512, 16), 4096),
    ("Ba 4416 / Bm 4416 / U 64, prefix ends inside a block", (4416, 4416, 64), 6000),
]
PROMPT_LEN, VOCAB = 8192, 256


def geometry_dict(args: argparse.Namespace, **override) -> dict:
    geometry = {
        "block_size": args.block_size,
        "mamba_block_size": args.mamba_block_size,
        "prefix_match_unit": args.prefix_match_unit,
        "eagle": args.eagle,
        "partial_hits": True,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "num_blocks": args.num_blocks,
    }
    return {**geometry, **override}


def junction_engine(
    geometry: dict, sink=None, runner: str = "null", tiers: TierConfig | None = None, **policy
) -> Engine:
    cache = CacheConfig(
        block_size=geometry["block_size"],
        mamba_block_size=geometry["mamba_block_size"],
        prefix_match_unit=geometry["prefix_match_unit"],
        eagle=geometry["eagle"],
        partial_hits=geometry["partial_hits"],
        num_blocks=geometry["num_blocks"],
        **policy,
    )
    scheduler = SchedulerConfig(max_num_batched_tokens=geometry["max_num_batched_tokens"])
    sink = sink if sink is not None else NullSink()
    return Engine(cache, scheduler, runner=runner, sink=sink, tiers=tiers)


def median_us(samples_ns: list[int]) -> float:
    return statistics.median(samples_ns) / 1e3


# ---------------------------------------------------------------------- 1. hits
def compare_hits(args, peer: PeerProcess, console: Console) -> None:
    items = read_trace(args.trace) if args.trace else build_workload(HIT_WORKLOAD).items()
    requests = [item for item in items if isinstance(item, TraceRequest)]
    expanded = [expanded_request(item) for item in requests]
    geometry = geometry_dict(args)
    unit = CacheConfig(
        block_size=args.block_size,
        mamba_block_size=args.mamba_block_size,
        prefix_match_unit=args.prefix_match_unit,
    ).match_unit
    best = oracle(requests, unit, args.eagle)
    runs = {
        "Junction (defaults)": _junction_hits(requests, geometry, args.concurrency),
        "Junction --no-partial-hits": _junction_hits(
            requests, {**geometry, "partial_hits": False}, args.concurrency
        ),
        "vLLM 0.33 (partial hits)": _peer_hits(peer, expanded, geometry, args.concurrency),
        "vLLM 0.33 (block-aligned)": _peer_hits(
            peer, expanded, {**geometry, "partial_hits": False}, args.concurrency
        ),
    }
    total_prompt = sum(len(r.token_ids) for r in requests)
    table = Table(title=f"hits: {len(requests)} requests, {total_prompt} prompt tokens")
    for column in ("engine", "hit tokens", "hit rate", "of the oracle"):
        table.add_column(column, justify="right" if column != "engine" else "left")
    table.add_row(
        "oracle", f"{best.num_oracle_tokens}", f"{best.num_oracle_tokens / total_prompt:.1%}", ""
    )
    for name, hits in runs.items():
        total = sum(hits)
        share = total / best.num_oracle_tokens if best.num_oracle_tokens else 0.0
        table.add_row(name, f"{total}", f"{total / total_prompt:.1%}", f"{share:.1%}")
    console.print(table)
    pairs = [
        ("Junction (defaults)", "vLLM 0.33 (partial hits)"),
        ("Junction --no-partial-hits", "vLLM 0.33 (block-aligned)"),
    ]
    for ours, theirs in pairs:
        below = [
            (request.request_id, mine, peer_hit, oracle_hit.num_oracle_tokens)
            for request, mine, peer_hit, oracle_hit in zip(
                requests, runs[ours], runs[theirs], best.hits, strict=True
            )
            if mine < peer_hit
        ]
        console.print(f"{ours} below {theirs}: {len(below)} of {len(requests)} requests")
        for request_id, mine, peer_hit, oracle_hit in below[:20]:
            console.print(f"  {request_id}: {mine} < {peer_hit} (oracle {oracle_hit})")
    if not args.totals_only:
        table = Table(title="hit tokens per request")
        for column in ("request", "oracle", *runs):
            table.add_column(column, justify="right")
        for index, request in enumerate(requests):
            table.add_row(
                request.request_id,
                str(best.hits[index].num_oracle_tokens),
                *(str(hits[index]) for hits in runs.values()),
            )
        console.print(table)


def _junction_hits(requests: list[TraceRequest], geometry: dict, concurrency: int) -> list[int]:
    records, _ = replay(junction_engine(geometry), requests, concurrency)
    return [record["num_cached_tokens"] for record in records]


def _peer_hits(peer, expanded: list[dict], geometry: dict, concurrency: int) -> list[int]:
    records = peer.replay(expanded, geometry, concurrency)
    return [record["num_cached_tokens"] for record in records]


# ---------------------------------------------------------------------- 2-4. timings
def alternate(rounds: int, ours: Callable[[], float], theirs: Callable[[], float]):
    """Median of each side over `rounds` alternating rounds (Junction first, then vLLM)."""
    mine, peer = [], []
    for _ in range(rounds):
        mine.append(ours())
        peer.append(theirs())
    return statistics.median(mine), statistics.median(peer)


def time_hashing(args, peer: PeerProcess, prompts: list[list[int]]):
    def ours() -> float:
        samples = []
        for prompt in prompts:
            start = time.perf_counter_ns()
            hash_prefix(prompt, 16)
            samples.append(time.perf_counter_ns() - start)
        return median_us(samples)

    def theirs() -> float:
        return median_us(peer.hash(prompts, 16)["ns"])

    return alternate(args.rounds, ours, theirs)


def lookup_prompts(shared: int, count: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Two warm prompts and `count` probes, all sharing the first `shared` tokens."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, VOCAB, shared).tolist()
    tails = rng.integers(0, VOCAB, (count + 2, PROMPT_LEN - shared)).tolist()
    prompts = [prefix + tail for tail in tails]
    return prompts[:2], prompts[2:]


def time_lookup(args, peer: PeerProcess, sizes: tuple[int, int, int], shared: int):
    block, mamba, unit = sizes
    geometry = geometry_dict(
        args,
        block_size=block,
        mamba_block_size=mamba,
        prefix_match_unit=unit,
        eagle=False,
        max_num_batched_tokens=8192,
        num_blocks=max(4096, 8 * PROMPT_LEN // block),
    )
    warm, probes = lookup_prompts(shared, args.lookups, args.seed)
    hits: dict[str, set[int]] = {"junction": set(), "vllm": set()}

    def ours() -> float:
        engine = junction_engine(geometry)
        engine.generate(warm, SamplingParams(max_tokens=1))
        lookup = engine.scheduler.coordinator.lookup
        all_hashes = [hash_prefix(p, unit) for p in probes]
        samples = []
        for hashes in all_hashes:
            start = time.perf_counter_ns()
            hit = lookup(hashes, PROMPT_LEN, needs_logits=True)
            samples.append(time.perf_counter_ns() - start)
            hits["junction"].add(hit.length)
        return median_us(samples)

    def theirs() -> float:
        answer = peer.lookup(geometry, warm, probes)
        hits["vllm"].update(answer["hit_tokens"])
        return median_us(answer["ns"])

    mine, theirs_us = alternate(args.rounds, ours, theirs)
    return mine, theirs_us, hits


def time_replay(args, peer: PeerProcess, console: Console):
    workload = build_workload(LOOP_WORKLOAD)
    requests = [item for item in workload.items() if isinstance(item, TraceRequest)]
    expanded = [expanded_request(item) for item in requests]
    geometry = geometry_dict(args, eagle=False, partial_hits=True, num_blocks=4096)
    walls: dict[str, list[float]] = {
        name: []
        for name in (
            "quiet",
            "tiers",
            "roomy",
            "roomy_tiers",
            "events",
            "ledger",
            "vllm",
            "vllm_manager",
        )
    }
    # pools that hold the whole loop: the tiers get nothing to do (idle)
    roomy = {**geometry, "num_blocks": ROOMY_BLOCKS}
    activity: dict[str, int] = {}
    num_events = 0

    def run(sink, runner: str = "null", tiers: TierConfig | None = None, pools=geometry) -> float:
        nonlocal num_events
        engine = junction_engine(pools, sink=sink, runner=runner, tiers=tiers)
        if isinstance(sink, ListSink):
            # the full stream, drained every step as the publisher does, then dropped
            def drain(engine: Engine) -> None:
                nonlocal num_events
                num_events += len(sink.drain())

            engine.step_listeners.append(drain)
        gc.collect()
        _, summary = replay(engine, requests)
        stats = engine.tier_stats()
        if stats is not None:
            key = "roomy" if pools is roomy else "tight"
            activity[f"{key}_moves"] = stats.num_saves + stats.num_loads
        return summary.wall_s

    answers: dict[str, dict] = {}
    for _ in range(args.rounds):
        walls["quiet"].append(run(NullSink()))
        walls["tiers"].append(run(NullSink(), tiers=IDLE_TIERS))
        walls["roomy"].append(run(NullSink(), pools=roomy))
        walls["roomy_tiers"].append(run(NullSink(), tiers=IDLE_TIERS, pools=roomy))
        walls["events"].append(run(ListSink()))
        walls["ledger"].append(run(NullSink(), "ledger"))
        for key, loop in (("vllm", "scheduler"), ("vllm_manager", "manager")):
            answers[key] = peer.replay_timed(expanded, geometry, loop=loop)
            walls[key].append(answers[key]["wall_s"])
    if answers["vllm"]["records"] != answers["vllm_manager"]["records"]:
        console.print("vLLM's minimal loop and its Scheduler differ in hits or chunks on this run")
    total = sum(len(r.token_ids) for r in requests)
    medians = {name: statistics.median(values) for name, values in walls.items()}
    medians["activity"] = activity
    return medians, len(requests), total, num_events // args.rounds


def timings(args, peer: PeerProcess, console: Console) -> None:
    table = Table(title=f"Junction and vLLM {peer.version}, medians of {args.rounds} rounds")
    for column in ("measure", "Junction", "vLLM", "ratio"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    if not args.replay_only:
        add_hash_and_lookup_rows(args, peer, table)
    replayed = time_replay(args, peer, console)
    add_replay_rows(table, *replayed)
    add_tier_rows(table, replayed[0])
    console.print(table)


def add_hash_and_lookup_rows(args, peer: PeerProcess, table: Table) -> None:
    rng = np.random.default_rng(args.seed)
    hash_prompts = rng.integers(0, VOCAB, (args.hashes, PROMPT_LEN)).tolist()
    mine, theirs = time_hashing(args, peer, hash_prompts)
    table.add_row(
        f"hash one {PROMPT_LEN}-token prompt at U 16",
        f"{mine:.1f} us",
        f"{theirs:.1f} us",
        f"{mine / theirs:.2f}",
    )
    for name, sizes, shared in LOOKUP_CASES:
        mine, theirs, hits = time_lookup(args, peer, sizes, shared)
        label = (
            f"lookup, {name} ({shared} shared; hit "
            f"{'/'.join(map(str, sorted(hits['junction'])))} vs "
            f"{'/'.join(map(str, sorted(hits['vllm'])))})"
        )
        table.add_row(label, f"{mine:.1f} us", f"{theirs:.1f} us", f"{mine / theirs:.2f}")


def add_replay_rows(table: Table, medians: dict, num_requests: int, num_tokens: int, num_events):
    """Junction's loops against vLLM's minimal KV-cache-manager loop, then against its full
    Scheduler."""
    loop = f"replay loop, {num_requests} requests, {num_tokens / 1e6:.2f}M tokens"
    ours = [
        ("null runner, no events", "quiet"),
        ("null runner, no events, host tier on (8 GiB, at work)", "tiers"),
        (f"null runner, every event ({num_events} a run)", "events"),
        ("ledger runner (every read checked), no events", "ledger"),
    ]
    peers = [
        ("vs vLLM's KVCacheManager, minimal loop", "vllm_manager"),
        ("vs vLLM's Scheduler", "vllm"),
    ]
    for peer_label, peer_key in peers:
        for label, key in ours:
            if peer_key == "vllm_manager" and key == "events":
                continue  # the minimal loop builds no events
            table.add_row(
                f"{loop}, {label}, {peer_label}",
                f"{medians[key]:.2f} s",
                f"{medians[peer_key]:.2f} s",
                f"{medians[key] / medians[peer_key]:.2f}",
            )


def add_tier_rows(table: Table, medians: dict) -> None:
    """The host tier's cost to the step loop, Junction with it over Junction without in the
    same run: idle (pools that hold the whole loop, so nothing moves; issue 46: within 10%),
    then at work (the 4096 blocks above, where states go down and come back)."""
    moves = medians["activity"]
    for label, on, off, key in (
        ("idle, pools holding the loop", "roomy_tiers", "roomy", "roomy_moves"),
        ("at work, 4096 blocks", "tiers", "quiet", "tight_moves"),
    ):
        table.add_row(
            f"replay loop, host tier on over off, {label} ({moves.get(key, 0)} saves and "
            "loads a run; Junction alone)",
            f"{medians[on]:.2f} s",
            f"{medians[off]:.2f} s (tier off)",
            f"{medians[on] / medians[off]:.2f}",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="a trace for the hit comparison (default: a workload)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--mamba-block-size", type=int, default=512)
    parser.add_argument("--prefix-match-unit", type=int, default=16)
    parser.add_argument("--eagle", action="store_true")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--totals-only", action="store_true", help="no table of every request's hits"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    parser.add_argument("--hashes", type=int, default=200, help="prompts hashed per round")
    parser.add_argument("--lookups", type=int, default=500, help="lookups per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-timings", action="store_true", help="hits only")
    parser.add_argument("--timings-only", action="store_true", help="timings, no hit tables")
    parser.add_argument(
        "--replay-only", action="store_true", help="of the timings, only the replay loop"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.skip_timings and (args.timings_only or args.replay_only):
        parser.error("--skip-timings contradicts --timings-only / --replay-only")
    if peer_python() is None:
        print("vs_vllm: no peer environment (.venv-peer): run `make peer` first", file=sys.stderr)
        return 2
    console = Console(width=160)
    with PeerProcess() as peer:
        if not (args.timings_only or args.replay_only):
            compare_hits(args, peer, console)
        if not args.skip_timings:
            timings(args, peer, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
