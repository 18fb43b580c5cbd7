"""Junction against transformers on one checkpoint, side by side in one run: prefill speed,
and the second turn's time to first token.

Random checkpoints of about 100M parameters, one Bamba-shaped (Mamba-2) and one Qwen3.5-shaped
(Gated DeltaNet), are built with transformers and written with a small tokenizer into a temp dir
(`engine.model.hf.synthetic`); both sides load each in the same process, dtype and thread
count.
- Prefill: tokens/s of one fresh prompt of 512, 2048 and 8192 tokens. Junction's time is the
  request's time to first token (cache on, nothing to hit); transformers' is one forward
  without a cache that keeps the last position's logits.
- Second turn: a 10000-token first turn, then the same prompt plus 200 tokens. Junction hits
  the first turn (partial hits, its defaults); transformers computes the whole prompt again.
Ratios are Junction over transformers, measured in this run (median of `--rounds`, the two
interleaved so machine noise falls on both). `--quick` uses smaller sizes.

    .venv/bin/python benchmarks/hf_reference.py [--quick] [--rounds 5] [--threads N]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--arch bamba qwen3_5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    BambaConfig,
    BambaForCausalLM,
    PreTrainedModel,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
)

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.model.hf.synthetic import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, write_checkpoint
from engine.request import SamplingParams

FULL = {"prefill": (512, 2048, 8192), "first": 10000, "extra": 200}
QUICK = {"prefill": (128, 512, 1024), "first": 2000, "extra": 100}
NUM_SPECIAL = 16  # the tokenizer's first ids; prompts avoid them
ONE = SamplingParams(max_tokens=1)
SPECIAL_IDS = {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}


def bamba_100m() -> PreTrainedModel:
    """About 100M parameters: 12 layers of 768, attention at 3, 7 and 11, Mamba-2 between."""
    config = BambaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=768,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
        num_hidden_layers=12,
        attn_layer_indices=[3, 7, 11],
        mamba_n_heads=24,
        mamba_d_state=128,
        **SPECIAL_IDS,
    )
    return BambaForCausalLM(config)


def qwen3_5_100m() -> PreTrainedModel:
    """About 100M parameters: 12 layers of 768, 3 Gated DeltaNet layers to 1 attention."""
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_key_heads=8,
        linear_num_value_heads=16,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        **SPECIAL_IDS,
    )
    return Qwen3_5ForCausalLM(config)


ARCHITECTURES = {"bamba": bamba_100m, "qwen3_5": qwen3_5_100m}


def junction_engine(model: ModelConfig, longest: int) -> Engine:
    """An engine with room for a `longest`-token prompt and its Mamba states, a second one
    cached beside it, and a budget of one chunk."""
    cache = CacheConfig(
        block_size=16,
        mamba_block_size=512,
        prefix_match_unit=16,
        num_blocks=2 * -(-longest // 16) + 64,
        num_mamba_blocks=4 * -(-longest // 512) + 32,
    )
    scheduler = SchedulerConfig(max_num_batched_tokens=max(8192, longest))
    return Engine(cache, scheduler, model, runner="torch")


def junction_ttft(engine: Engine, prompt: list[int]) -> float:
    (request,) = engine.generate([prompt], ONE)
    return request.ttft_s


def reference_seconds(reference, prompt: list[int], device: str) -> float:
    """One transformers forward over `prompt`, no cache, the last position's logits."""
    ids = torch.tensor([prompt], device=device)
    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        reference(input_ids=ids, use_cache=False, logits_to_keep=1)
    synchronize(device)
    return time.perf_counter() - start


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_of(rounds: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller prompts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--arch", nargs="+", default=list(ARCHITECTURES), choices=list(ARCHITECTURES)
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.arch:
            torch.manual_seed(0)
            path = write_checkpoint(ARCHITECTURES[name](), Path(tmp) / f"{name}-100m")
            compare(name, path, args)


def compare(name: str, path: Path, args: argparse.Namespace) -> None:
    """Both measurements on the checkpoint at `path`, printed as a table."""
    sizes = QUICK if args.quick else FULL
    rng = np.random.default_rng(0)

    def tokens(n: int) -> list[int]:
        return rng.integers(NUM_SPECIAL, VOCAB_SIZE, n).tolist()

    dtype = getattr(torch, args.dtype)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    num_params = sum(p.numel() for p in reference.parameters())
    model = ModelConfig(model_dir=str(path), device=args.device, dtype=args.dtype)
    longest = max(*sizes["prefill"], sizes["first"] + sizes["extra"])
    # one engine throughout: random prompts share nothing but what a test sends twice
    engine = junction_engine(model, longest)
    junction_ttft(engine, tokens(64))  # warm-up
    reference_seconds(reference, tokens(64), args.device)

    print(
        f"random {name}-shaped checkpoint, {num_params / 1e6:.0f}M parameters, "
        f"{args.device} {args.dtype}, {args.threads} threads, median of {args.rounds}"
    )
    print(f"{'prefill':>8}{'junction tok/s':>16}{'transformers tok/s':>20}{'ratio':>8}")
    for n in sizes["prefill"]:
        junction_s, reference_s = [], []
        for _ in range(args.rounds):
            prompt = tokens(n)  # fresh each round: nothing to hit
            junction_s.append(junction_ttft(engine, prompt))
            reference_s.append(reference_seconds(reference, prompt, args.device))
        ours, theirs = n / statistics.median(junction_s), n / statistics.median(reference_s)
        print(f"{n:>8}{ours:>16.0f}{theirs:>20.0f}{ours / theirs:>7.2f}x")

    first, extra = sizes["first"], sizes["extra"]
    junction_s, reference_s, hits = [], [], []
    for _ in range(args.rounds):
        turn = tokens(first)
        second = turn + tokens(extra)
        engine.generate([turn], ONE)
        (request,) = engine.generate([second], ONE)
        junction_s.append(request.ttft_s)
        hits.append(request.num_cached_tokens)
        reference_s.append(reference_seconds(reference, second, args.device))
    ours, theirs = statistics.median(junction_s), statistics.median(reference_s)
    print(
        f"second turn ({first} + {extra} tokens): junction TTFT {ours * 1e3:.1f} ms "
        f"(hit {min(hits)}-{max(hits)} tokens), transformers {theirs * 1e3:.1f} ms "
        f"(recomputes all): {ours / theirs:.3f}x"
    )
    del engine, reference


if __name__ == "__main__":
    main()
