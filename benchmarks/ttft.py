"""Time to first token of a second turn on the torch runner, three cache modes side by side.

The multi-turn case of the seeds: a 10000-token request, then the same prompt plus 200 tokens,
one output token each (attention block 16, Mamba block 512, match unit 16). For the second
request it prints the time to first token with fine-grained (partial) hits, with block-aligned
hits only, and with the cache off, each as a ratio to the cache-off time, and the tokens each
computed. Modes are interleaved over `--rounds` so machine noise falls on all three alike.

    .venv/bin/python benchmarks/ttft.py [--rounds 3] [--device cpu|cuda] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from tqdm import tqdm

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams

MODES = {
    "partial hits": {"partial_hits": True},
    "block-aligned": {"partial_hits": False},
    "cache off": {"enable_prefix_caching": False},
}
FIRST, EXTRA = 10000, 200


def second_turn(mode: dict, model: ModelConfig, prompts: tuple[list[int], list[int]]):
    cache = CacheConfig(
        block_size=16,
        mamba_block_size=512,
        prefix_match_unit=16,
        num_blocks=1024,
        num_mamba_blocks=64,
        **mode,
    )
    engine = Engine(cache, SchedulerConfig(max_num_batched_tokens=8192), model, runner="torch")
    one = SamplingParams(max_tokens=1)
    engine.generate([prompts[0]], one)
    (second,) = engine.generate([prompts[1]], one)
    return second.ttft_s, second.num_prefill_computed, second.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    model = ModelConfig(device=args.device, dtype=args.dtype)
    rng = np.random.default_rng(0)
    first = rng.integers(0, 256, FIRST).tolist()
    prompts = (first, first + rng.integers(0, 256, EXTRA).tolist())
    second_turn(MODES["cache off"], model, prompts)  # warm-up: allocator, kernels, threads
    ttft: dict[str, list[float]] = {name: [] for name in MODES}
    computed: dict[str, tuple[int, int]] = {}
    for _ in tqdm(range(args.rounds), desc="rounds", unit="round"):
        for name, mode in MODES.items():
            seconds, num_computed, num_cached = second_turn(mode, model, prompts)
            ttft[name].append(seconds)
            computed[name] = (num_computed, num_cached)
    base = statistics.median(ttft["cache off"])
    device = args.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    print(f"second turn ({FIRST} + {EXTRA} tokens) on the torch runner, {device} {args.dtype},")
    print(f"median of {args.rounds} interleaved rounds")
    print(f"{'mode':<16}{'TTFT ms':>10}{'vs cache off':>14}{'computed':>10}{'hit':>8}")
    for name in MODES:
        median = statistics.median(ttft[name])
        num_computed, num_cached = computed[name]
        print(
            f"{name:<16}{median * 1e3:>10.1f}{median / base:>14.3f}"
            f"{num_computed:>10}{num_cached:>8}"
        )


if __name__ == "__main__":
    main()
