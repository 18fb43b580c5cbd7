"""The prefix cache's hot path: hashing a prompt, one hybrid lookup, one scheduler step.

Workload: `--requests` prompts of 8192 token ids in [0, 256) that share a 4096-token prefix
and differ after it, on attention block 16, Mamba block 64 and match unit 16. Every figure
below is measured in this one run; the vLLM figures are constants measured on this machine.

    .venv/bin/python benchmarks/lookup.py [--requests 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import numpy as np
from tqdm import tqdm

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.hashing import BlockHash, hash_prefix
from engine.request import SamplingParams

NUM_TOKENS, NUM_PREFIX, VOCAB = 8192, 4096, 256
BLOCK, MAMBA_BLOCK, UNIT = 16, 64, 16
NUM_RUNNING, MAX_TOKENS, WARMUP_STEPS = 64, 200, 10
# Enough attention blocks for 64 running requests of 8192 + 200 tokens, with room to spare.
NUM_BLOCKS = NUM_RUNNING * -(-(NUM_TOKENS + MAX_TOKENS) // BLOCK) + 4096
VLLM_US = {"hash": 2900.0, "fine": 230.0, "aligned": 17.0}
TARGET_US = {"hash": 300.0, "lookup": 50.0}


def make_prompts(num: int, seed: int) -> list[list[int]]:
    """`num` prompts: one shared prefix, then a tail drawn afresh for each request."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, VOCAB, NUM_PREFIX).tolist()
    tails = rng.integers(0, VOCAB, (num, NUM_TOKENS - NUM_PREFIX)).tolist()
    return [prefix + tail for tail in tails]


def cache_config(partial_hits: bool) -> CacheConfig:
    return CacheConfig(
        block_size=BLOCK,
        mamba_block_size=MAMBA_BLOCK,
        prefix_match_unit=UNIT,
        num_blocks=NUM_BLOCKS,
        partial_hits=partial_hits,
    )


def summary(samples_ns: list[int]) -> tuple[float, float, float]:
    """(median, p90, mean) in microseconds."""
    us = sorted(s / 1e3 for s in samples_ns)
    p90 = us[min(len(us) - 1, int(0.9 * len(us)))]
    return statistics.median(us), p90, statistics.fmean(us)


def time_each(
    items: list, call: Callable, warmup: int, desc: str | None = None
) -> tuple[list[int], list]:
    """Nanoseconds and result of `call(item)` for every item, after `warmup` untimed calls."""
    for item in items[:warmup]:
        call(item)
    clock = time.perf_counter_ns
    samples, results = [], []
    for item in tqdm(items, desc=desc, leave=False, disable=desc is None):
        start = clock()
        result = call(item)
        samples.append(clock() - start)
        results.append(result)
    return samples, results


def bench_lookup(partial_hits: bool, prefix: list[int], all_hashes: list[list[BlockHash]]):
    """Warm an engine with the shared prefix (its attention blocks and a Mamba checkpoint at
    4096), then time one lookup per request. Returns the samples and the set of hit lengths."""
    engine = Engine(cache_config(partial_hits))
    engine.generate([prefix], SamplingParams(max_tokens=1))
    lookup = engine.scheduler.coordinator.lookup
    samples, hits = time_each(
        all_hashes, lambda h: lookup(h, NUM_TOKENS, needs_logits=True), warmup=100
    )
    return samples, "/".join(str(n) for n in sorted({hit.length for hit in hits}))


def bench_scheduler(prompts: list[list[int]]) -> list[int]:
    """Scheduler-only nanoseconds (`schedule` + `update`, not the runner) of each decode step
    in which all `NUM_RUNNING` requests are decoding, less the first `WARMUP_STEPS`."""
    engine = Engine(
        cache_config(partial_hits=True),
        SchedulerConfig(max_num_batched_tokens=NUM_RUNNING * NUM_TOKENS, max_num_seqs=NUM_RUNNING),
    )
    for prompt in prompts[:NUM_RUNNING]:
        engine.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS))
    scheduler, runner, clock = engine.scheduler, engine.runner, time.perf_counter_ns
    samples: list[int] = []
    with tqdm(desc="scheduler steps", unit="step", leave=False) as progress:
        while engine.has_unfinished():
            start = clock()
            out = scheduler.schedule()
            scheduled = clock()
            result = runner.execute(out)
            ran = clock()
            scheduler.update(out, result)
            done = clock()
            is_full_decode = len(out.chunks) == NUM_RUNNING and all(
                c.start == c.end - 1 and c.sample for c in out.chunks
            )
            if is_full_decode and not scheduler.waiting:
                samples.append(scheduled - start + done - ran)
            progress.update()
    engine.check_invariants()  # untimed: the engine must end consistent
    return samples[WARMUP_STEPS:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests to hash and look up")
    parser.add_argument("--seed", type=int, default=0, help="seed of the token ids")
    args = parser.parse_args()
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")

    prompts = make_prompts(max(args.requests, NUM_RUNNING), args.seed)
    gc.collect()
    gc.freeze()  # the prompts live all run long: keep collections from rescanning them
    hash_ns, hashes = time_each(
        prompts[: args.requests], lambda p: hash_prefix(p, UNIT), warmup=20, desc="hash"
    )
    fine_ns, fine_hits = bench_lookup(True, prompts[0][:NUM_PREFIX], hashes)
    aligned_ns, aligned_hits = bench_lookup(False, prompts[0][:NUM_PREFIX], hashes)
    step_ns = bench_scheduler(prompts)

    hash_us, fine_us, aligned_us = summary(hash_ns), summary(fine_ns), summary(aligned_ns)
    step_median, _, step_mean = summary(step_ns)
    print(
        f"{args.requests} requests of {NUM_TOKENS} tokens, {NUM_PREFIX}-token shared prefix, "
        f"seed {args.seed}; attention block {BLOCK}, Mamba block {MAMBA_BLOCK}, unit {UNIT}"
    )
    print(f"{'':30}{'median us':>12}{'p90 us':>12}{'vLLM us':>10}{'ours/vLLM':>11}")
    rows = [
        ("hash_prefix (8192 tokens)", hash_us, VLLM_US["hash"]),
        (f"lookup fine-grained (hit {fine_hits})", fine_us, VLLM_US["fine"]),
        (f"lookup aligned (hit {aligned_hits})", aligned_us, VLLM_US["aligned"]),
    ]
    for name, (median, p90, _), vllm in rows:
        print(f"{name:30}{median:12.1f}{p90:12.1f}{vllm:10.0f}{median / vllm:11.3f}")
    print(
        f"lookup fine-grained / aligned: {fine_us[0] / aligned_us[0]:.2f}x "
        f"(vLLM {VLLM_US['fine'] / VLLM_US['aligned']:.1f}x)"
    )
    print(
        f"scheduler step, {NUM_RUNNING} decoding: mean {step_mean:.1f} us, "
        f"median {step_median:.1f} us over {len(step_ns)} steps (schedule + update, no runner)"
    )
    for name, ours, target in [
        ("hash", hash_us[0], TARGET_US["hash"]),
        ("lookup fine-grained", fine_us[0], TARGET_US["lookup"]),
        ("lookup aligned", aligned_us[0], TARGET_US["lookup"]),
    ]:
        verdict = "meets" if ours < target else "MISSES"
        print(f"target {name} < {target:.0f} us: {ours:.1f} us, {verdict}")


if __name__ == "__main__":
    main()
