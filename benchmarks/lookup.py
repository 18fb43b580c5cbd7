"""Junction's prefix-cache hot path: hashing a prompt, one hybrid lookup, one scheduler step.

Workload: `--requests` prompts of 8192 token ids in [0, 256) that share a `--shared`-token
prefix (default 4000: it ends inside an attention block and inside a Mamba block) and differ
after it, on attention block 64, Mamba block 512 and match unit 16, so the fine-grained lookup
scans inside the attention block past the last whole one; the block-aligned lookup (partial
hits off) lands on lcm(64, 512) = 512 boundaries. Then, per eviction policy, one allocation
from a Mamba pool of `EVICTION_POOL` states all cached and free, a third of them shared by
earlier requests, each allocation evicting one (the pool's hot path under pressure). Every
figure is measured in this run. This script times Junction alone; `benchmarks/vs_vllm.py`
times vLLM's code beside it.

    .venv/bin/python benchmarks/lookup.py [--requests 1000] [--shared 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import numpy as np
from tqdm import tqdm

from engine.cache.block_pool import BlockPool
from engine.cache.entry import CheckpointReason
from engine.cache.eviction import EVICTION_NAMES
from engine.cache.eviction.abilities import Learns
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.hashing import BlockHash, hash_prefix
from engine.request import SamplingParams

NUM_TOKENS, VOCAB = 8192, 256
BLOCK, MAMBA_BLOCK, UNIT = 64, 512, 16
NUM_RUNNING, MAX_TOKENS, WARMUP_STEPS = 64, 200, 10
# Enough attention blocks for 64 running requests of 8192 + 200 tokens, with room to spare.
NUM_BLOCKS = NUM_RUNNING * -(-(NUM_TOKENS + MAX_TOKENS) // BLOCK) + 1024
TARGET_US = {"hash": 300.0, "lookup": 50.0}
EVICTION_POOL, EVICTIONS = 4096, 1000


def make_prompts(num: int, num_shared: int, seed: int) -> list[list[int]]:
    """`num` prompts: one shared prefix, then a tail drawn afresh for each request."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, VOCAB, num_shared).tolist()
    tails = rng.integers(0, VOCAB, (num, NUM_TOKENS - num_shared)).tolist()
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
    """Warm an engine with the shared prefix alone (its attention blocks, and the Mamba
    checkpoints its prefill keeps: the extension checkpoint at its end, or the last block
    boundary when hits are block-aligned), then time one lookup per request. Returns the
    samples and the set of hit lengths."""
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


def bench_eviction(policy: str) -> list[int]:
    """Nanoseconds of each allocate-and-cache of one state from a Mamba pool of
    `EVICTION_POOL` free cached states under `policy`, the block freed again after it."""
    pool = BlockPool(EVICTION_POOL, MAMBA_BLOCK, "mamba", 1, eviction=policy, holds_states=True)

    def key(index: int) -> BlockHash:
        return index.to_bytes(16, "little")

    blocks = pool.allocate(EVICTION_POOL)
    for index, block in enumerate(blocks):
        pool.cache(block.block_id, [(key(index), MAMBA_BLOCK, CheckpointReason.BLOCK)], None)
    if isinstance(pool.eviction, Learns):  # a policy that learns from prompts is shown them
        for index in range(0, EVICTION_POOL, 3):  # shared: two requests passed each
            for sibling in (1, 2):
                pool.eviction.observe([key(index), key(10**9 + 2 * index + sibling)])
    pool.free([block.block_id for block in blocks])

    def evict_one(index: int) -> None:
        (block,) = pool.allocate(1)
        pool.cache(block.block_id, [(key(index), MAMBA_BLOCK, CheckpointReason.BLOCK)], None)
        pool.free([block.block_id])

    first = EVICTION_POOL + 1
    samples, _ = time_each(list(range(first, first + EVICTIONS)), evict_one, warmup=50)
    pool.check_invariants()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests to hash and look up")
    parser.add_argument("--shared", type=int, default=4000, help="tokens the prompts share")
    parser.add_argument("--seed", type=int, default=0, help="seed of the token ids")
    args = parser.parse_args()
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")
    if not UNIT <= args.shared < NUM_TOKENS:
        parser.error(f"--shared must lie in [{UNIT}, {NUM_TOKENS}), got {args.shared}")

    prompts = make_prompts(max(args.requests, NUM_RUNNING), args.shared, args.seed)
    gc.collect()
    gc.freeze()  # the prompts live all run long: keep collections from rescanning them
    hash_ns, hashes = time_each(
        prompts[: args.requests], lambda p: hash_prefix(p, UNIT), warmup=20, desc="hash"
    )
    fine_ns, fine_hits = bench_lookup(True, prompts[0][: args.shared], hashes)
    aligned_ns, aligned_hits = bench_lookup(False, prompts[0][: args.shared], hashes)
    step_ns = bench_scheduler(prompts)
    eviction_us = {policy: summary(bench_eviction(policy)) for policy in EVICTION_NAMES}

    hash_us, fine_us, aligned_us = summary(hash_ns), summary(fine_ns), summary(aligned_ns)
    step_median, _, step_mean = summary(step_ns)
    print(
        f"{args.requests} requests of {NUM_TOKENS} tokens, {args.shared}-token shared prefix, "
        f"seed {args.seed}; attention block {BLOCK}, Mamba block {MAMBA_BLOCK}, unit {UNIT}"
    )
    print(f"{'Junction':34}{'median us':>12}{'p90 us':>12}")
    rows = [
        ("hash_prefix (8192 tokens)", hash_us),
        (f"lookup fine-grained (hit {fine_hits})", fine_us),
        (f"lookup block-aligned (hit {aligned_hits})", aligned_us),
    ]
    rows += [
        (f"evict a state of {EVICTION_POOL} ({policy})", us) for policy, us in eviction_us.items()
    ]
    for name, (median, p90, _) in rows:
        print(f"{name:34}{median:12.1f}{p90:12.1f}")
    print(f"lookup fine-grained / block-aligned: {fine_us[0] / aligned_us[0]:.2f}x")
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
