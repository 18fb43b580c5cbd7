"""What a pin buys: 64 requests of one 560-token system prompt plus a 1386-token question.

Side by side in one run, on the same requests: no partial hits; partial hits; partial hits
plus junction checkpoints; plus a pin of the system prompt made before the first request; and
the oracle hit rate (every token truly shared with an earlier request or the pinned prefix,
at most `P - 1` of each prompt). Attention block 16, Mamba block 512, match unit 16.

    .venv/bin/python benchmarks/pins.py [--requests 64] [--runner torch|ledger|null]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from tqdm import tqdm

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams

SYSTEM, QUESTION = 560, 1386
MODES = {
    "no partial hits": ({"partial_hits": False}, False),
    "partial hits": ({}, False),
    "+ junction checkpoints": ({"junction_checkpoints": True}, False),
    "+ pin before the first": ({"junction_checkpoints": True}, True),
}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def oracle_hits(system: list[int], prompts: list[list[int]]) -> int:
    total = 0
    for i, prompt in enumerate(prompts):
        shared = max(
            [common_prefix(prompt, system)] + [common_prefix(prompt, p) for p in prompts[:i]]
        )
        total += min(shared, len(prompt) - 1)
    return total


def run_mode(overrides: dict, pin: bool, runner: str, system, prompts) -> tuple[int, list[float]]:
    cache = CacheConfig(
        block_size=16,
        mamba_block_size=512,
        prefix_match_unit=16,
        num_blocks=1024,
        num_mamba_blocks=128,
        **overrides,
    )
    engine = Engine(cache, SchedulerConfig(), ModelConfig(), runner=runner)
    if pin:
        engine.pin("system", system)
        engine.run_until_done()
    hits, ttfts = 0, []
    for prompt in prompts:  # one at a time: each request's TTFT is its own
        (request,) = engine.generate([prompt], SamplingParams(max_tokens=1))
        hits += request.num_cached_tokens
        ttfts.append(request.ttft_s)
    return hits, ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--runner", default="torch", choices=["torch", "ledger", "null"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    system = rng.integers(0, 256, SYSTEM).tolist()
    prompts = [system + rng.integers(0, 256, QUESTION).tolist() for _ in range(args.requests)]
    num_prompt = sum(len(p) for p in prompts)
    results = {}
    for name, (overrides, pin) in tqdm(MODES.items(), desc="modes", unit="mode"):
        results[name] = run_mode(overrides, pin, args.runner, system, prompts)
    oracle = oracle_hits(system, prompts)
    print(
        f"{args.requests} requests of a {SYSTEM}-token system prompt + a {QUESTION}-token "
        f"question, {args.runner} runner"
    )
    print(f"{'mode':<26}{'hit rate':>10}{'vs oracle':>11}{'mean TTFT ms':>14}{'first ms':>10}")
    for name, (hits, ttfts) in results.items():
        print(
            f"{name:<26}{hits / num_prompt:>10.3f}{hits / oracle:>11.3f}"
            f"{statistics.fmean(ttfts) * 1e3:>14.1f}{ttfts[0] * 1e3:>10.1f}"
        )
    print(f"{'oracle (pinned prefix)':<26}{oracle / num_prompt:>10.3f}{1:>11.3f}")


if __name__ == "__main__":
    main()
