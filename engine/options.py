"""The options the engine's commands share, and what they build: the cache, scheduler and model
configs (`replay`, `serve`), and the exit codes.

`engine/server/replay_cli.py` (`replay`) and `engine/server/cli.py` (`serve`) add these to their
parsers; `engine/bench/cli.py` uses the exit codes. Where the commands stream cache events
(`--control-plane`) is `engine/server/streaming.py`'s.
"""

from __future__ import annotations

import argparse

from engine.config import (
    CHECKPOINT_MODES,
    DEFAULT_CHECKPOINT_INTERVAL,
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
)
from engine.runners import RUNNER_NAMES

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    """The cache and scheduler options `replay` and `serve` share (DESIGN.md section 4)."""
    group = parser.add_argument_group("cache")
    group.add_argument("--runner", choices=RUNNER_NAMES, default="null")
    group.add_argument("--block-size", type=int, default=16, help="attention block size Ba")
    group.add_argument("--mamba-block-size", type=int, default=512, help="Mamba block size Bm")
    group.add_argument(
        "--prefix-match-unit",
        type=int,
        default=None,
        help="match unit U (default: gcd of the block sizes)",
    )
    group.add_argument("--dcp-size", type=int, default=1, help="decode context parallel size D")
    group.add_argument("--eagle", action="store_true", help="EAGLE drafts: hits drop one unit")
    group.add_argument(
        "--no-partial-hits", action="store_true", help="hit only on lcm(Ba, Bm) boundaries"
    )
    group.add_argument(
        "--junction-checkpoints",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the Mamba state where a request leaves the cached prefix (default: on)",
    )
    group.add_argument(
        "--checkpoint-mode",
        choices=CHECKPOINT_MODES,
        default="inline",
        help="inline: write states inside chunks (default); stops: end chunks at checkpoints",
    )
    group.add_argument(
        "--checkpoint-interval",
        type=int,
        default=None,
        metavar="TOKENS",
        help=f"inline: also keep a Mamba state every TOKENS tokens, only in spare blocks "
        f"(default {DEFAULT_CHECKPOINT_INTERVAL} rounded up to the match unit; 0: none)",
    )
    group.add_argument("--max-num-batched-tokens", type=int, default=8192)
    group.add_argument("--long-prefill-threshold", type=int, default=0)
    group.add_argument("--num-blocks", type=int, default=4096, help="blocks per group")
    group.add_argument(
        "--num-mamba-blocks",
        type=int,
        default=None,
        help="Mamba state slots, when they should differ from --num-blocks",
    )
    group.add_argument(
        "--pin-max-share",
        type=float,
        default=0.25,
        help="the share of each group's blocks that pins may hold (default 0.25)",
    )
    group.add_argument(
        "--no-prefix-caching", action="store_true", help="cache off: the reference for outputs"
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The torch runner's model: weights from a seed or a safetensors file, device, dtype."""
    group = parser.add_argument_group("model (torch runner)")
    group.add_argument("--weights", default=None, help="safetensors file of the model's shape")
    group.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    group.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        seed=args.seed, device=args.device, dtype=args.dtype, weights_path=args.weights
    )


def configs_from_args(args: argparse.Namespace) -> tuple[CacheConfig, SchedulerConfig]:
    cache = CacheConfig(
        block_size=args.block_size,
        mamba_block_size=args.mamba_block_size,
        prefix_match_unit=args.prefix_match_unit,
        dcp_size=args.dcp_size,
        num_blocks=args.num_blocks,
        num_mamba_blocks=args.num_mamba_blocks,
        pin_max_share=args.pin_max_share,
        enable_prefix_caching=not args.no_prefix_caching,
        partial_hits=not args.no_partial_hits,
        junction_checkpoints=args.junction_checkpoints,
        checkpoint_mode=args.checkpoint_mode,
        checkpoint_interval=args.checkpoint_interval,
        eagle=args.eagle,
    )
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_threshold=args.long_prefill_threshold,
    )
    return cache, scheduler
