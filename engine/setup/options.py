"""The options the engine's commands share, and what they build: the cache, scheduler and model
configs (`replay`, `serve`), and the exit codes. `--model` names a checkpoint directory
(`engine.setup.model_dir`); `--kv-cache-memory` sizes both pools from bytes
(`engine.setup.cache_memory`).

`serve/replay_cli.py` (`replay`) and `serve/cli.py` (`serve`) add these to their
parsers; `bench/cli.py` uses the exit codes. Where the commands stream cache events
(`--control-plane`) is `publish/streaming.py`'s.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from engine.cache.eviction import DEFAULT_EVICTION, EVICTION_NAMES
from engine.config import (
    CHECKPOINT_MODES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MAMBA_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_NUM_BLOCKS,
    DEFAULT_PIN_MAX_SHARE,
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
    TierConfig,
)
from engine.runners import RUNNER_NAMES
from engine.setup.cache_memory import (
    PoolSizes,
    budget_bytes,
    parse_budget,
    parse_bytes,
    size_pools,
)
from engine.setup.footprint import footprint
from engine.setup.model_dir import checkpoint_max_len, resolve_model_dir
from engine.tiers.setup import DEFAULT_HOST_SHARE, default_host_bytes

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def add_cache_options(parser: argparse.ArgumentParser, num_mamba_blocks: int | None = None) -> None:
    """The cache and scheduler options `replay` and `serve` share (docs/api.md, the CLI);
    `num_mamba_blocks` is the command's default number of Mamba slots (None: `--num-blocks`)."""
    parser.set_defaults(default_num_mamba_blocks=num_mamba_blocks)
    group = parser.add_argument_group("cache")
    group.add_argument("--runner", choices=RUNNER_NAMES, default="null")
    group.add_argument(
        "--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="attention block size Ba"
    )
    group.add_argument(
        "--mamba-block-size", type=int, default=DEFAULT_MAMBA_BLOCK_SIZE, help="Mamba block size Bm"
    )
    group.add_argument(
        "--prefix-match-unit",
        type=int,
        default=None,
        help="match unit U (default: gcd of the block sizes)",
    )
    group.add_argument("--dcp-size", type=int, default=1, help="decode context parallel size D")
    _add_checkpoint_options(group)
    group.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    group.add_argument("--long-prefill-threshold", type=int, default=0)
    group.add_argument(
        "--max-prefix-wait-steps",
        type=int,
        default=SchedulerConfig.max_prefix_wait_steps,
        metavar="STEPS",
        help="steps a request may wait for one in flight that computes its prefix "
        f"(default {SchedulerConfig.max_prefix_wait_steps}; 0: never wait)",
    )
    _add_pool_options(group, num_mamba_blocks)
    group.add_argument(
        "--no-prefix-caching", action="store_true", help="cache off: the reference for outputs"
    )


def _add_checkpoint_options(group: argparse._ArgumentGroup) -> None:
    """Where hits may land and which Mamba states are kept (docs/rules.md sections 2 and 5)."""
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


def _add_pool_options(group: argparse._ArgumentGroup, num_mamba_blocks: int | None) -> None:
    """How many blocks each group's pool holds, and the share pins may take."""
    group.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help=f"attention blocks (default {DEFAULT_NUM_BLOCKS}, or what --kv-cache-memory buys)",
    )
    group.add_argument(
        "--num-mamba-blocks",
        type=int,
        default=None,
        help=f"Mamba state slots (default {num_mamba_blocks or 'as --num-blocks'}); with "
        "--kv-cache-memory it fixes the slots, and attention blocks take the rest",
    )
    group.add_argument(
        "--kv-cache-memory",
        default=None,
        metavar="BYTES|FRACTION",
        help="size both pools from memory: bytes (8GiB, 512MiB) or a fraction of the device's "
        "free memory less the weights (0.9); split so both pools cover the same tokens",
    )
    group.add_argument(
        "--eviction",
        choices=EVICTION_NAMES,
        default=DEFAULT_EVICTION,
        help=f"which free blocks are given up first and which spare states are written "
        f"(docs/rules.md section 12; default {DEFAULT_EVICTION})",
    )
    group.add_argument(
        "--pin-max-share",
        type=float,
        default=DEFAULT_PIN_MAX_SHARE,
        help=f"the share of each group's blocks that pins may hold "
        f"(default {DEFAULT_PIN_MAX_SHARE})",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The torch runner's model: a checkpoint directory, or the built-in model's weights from
    a seed or a safetensors file; device, dtype."""
    group = parser.add_argument_group("model (torch runner)")
    group.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="a Hugging Face-format checkpoint directory (or a hub id already in the local "
        "cache; nothing is downloaded); default: the built-in model of random weights",
    )
    group.add_argument("--weights", default=None, help="safetensors file of the built-in model")
    group.add_argument("--seed", type=int, default=0, help="seed of the built-in random weights")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    group.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")


HOST_AUTO = "auto"


def add_tier_options(parser: argparse.ArgumentParser, host_default: str) -> None:
    """The tiers under the device pools (docs/rules.md section 16). `host_default` is the
    command's `--host-cache-bytes`: `auto` (a share of the memory free at start) or bytes."""
    group = parser.add_argument_group("tiers below the device")
    group.add_argument(
        "--host-cache-bytes",
        default=os.environ.get("JUNCTION_HOST_CACHE_BYTES", host_default),
        metavar="BYTES",
        help="host memory for states and attention the device gives up (8GiB, 0: none; "
        f"auto: {DEFAULT_HOST_SHARE * 100:.0f}%% of the memory free at start, less the "
        "device pools when they are in host memory too; "
        f"default {host_default}; JUNCTION_HOST_CACHE_BYTES)",
    )
    group.add_argument(
        "--disk-cache-dir",
        default=os.environ.get("JUNCTION_DISK_CACHE_DIR"),
        metavar="DIR",
        help="a directory for a disk tier under host memory, kept across restarts of the same "
        "model and geometry (default none; JUNCTION_DISK_CACHE_DIR)",
    )
    group.add_argument(
        "--disk-cache-bytes",
        default=os.environ.get("JUNCTION_DISK_CACHE_BYTES", "0"),
        metavar="BYTES",
        help="the most the disk tier's files take (needed with --disk-cache-dir; "
        "JUNCTION_DISK_CACHE_BYTES)",
    )
    for flag, what in _RATE_FLAGS:
        group.add_argument(
            flag,
            type=float,
            default=os.environ.get(_rate_variable(flag)),
            metavar="RATE",
            help=f"{what}, as this engine prices tier loads and its feed tells routers "
            f"(default: measured at start; {_rate_variable(flag)})",
        )


_RATE_FLAGS = (
    ("--prefill-tokens-per-s", "prefill tokens per second"),
    ("--host-bytes-per-s", "bytes per second a load from host memory reads"),
    ("--disk-bytes-per-s", "bytes per second a load from the disk tier reads"),
)


def _rate_variable(flag: str) -> str:
    return "JUNCTION_" + flag.removeprefix("--").replace("-", "_").upper()


def _rates(args: argparse.Namespace) -> list[float | None]:
    """The rate flags' values; `ValueError` naming the flag for one that is not > 0."""
    rates = []
    for flag, _ in _RATE_FLAGS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        try:
            rate = None if value is None else float(value)
        except ValueError:
            rate = -1.0
        if rate is not None and not 0 < rate < float("inf"):
            raise ValueError(
                f"{flag} ({_rate_variable(flag)}) must be a number > 0, got {value!r}; "
                "leave it out to measure it at start"
            )
        rates.append(rate)
    return rates


def tier_config_from_args(
    args: argparse.Namespace, cache: CacheConfig, model: ModelConfig
) -> TierConfig:
    """The tiers the options ask for; `ValueError` naming the option for a bad value."""
    host = str(args.host_cache_bytes)
    if host.strip().lower() == HOST_AUTO:
        from engine.model.build import resolve_device

        host_bytes = default_host_bytes()
        if str(resolve_device(model)).startswith("cpu"):  # the pools take host memory too
            cost = footprint(model)
            pools = (
                cache.num_blocks * cache.attention_block_size * cost.attention_bytes_per_token
                + cache.mamba_num_blocks * cost.mamba_bytes_per_slot
            )
            host_bytes = max(0, host_bytes - int(pools * DEFAULT_HOST_SHARE))
    else:
        host_bytes = parse_bytes(host, "--host-cache-bytes (JUNCTION_HOST_CACHE_BYTES)")
    disk_bytes = parse_bytes(
        args.disk_cache_bytes, "--disk-cache-bytes (JUNCTION_DISK_CACHE_BYTES)"
    )
    if args.disk_cache_dir is not None and disk_bytes <= 0:
        raise ValueError(
            f"--disk-cache-dir {args.disk_cache_dir}: give --disk-cache-bytes too "
            "(JUNCTION_DISK_CACHE_BYTES), the most its files may take"
        )
    if args.disk_cache_dir is None and disk_bytes:
        raise ValueError("--disk-cache-bytes needs --disk-cache-dir (JUNCTION_DISK_CACHE_DIR)")
    prefill, host_rate, disk_rate = _rates(args)
    return TierConfig(
        host_bytes,
        args.disk_cache_dir,
        disk_bytes,
        host_bytes_per_s=host_rate,
        disk_bytes_per_s=disk_rate,
        prefill_tokens_per_s=prefill,
    )


def describe_tiers(config: TierConfig) -> str:
    """The start-up line about the tiers."""
    if not config.is_enabled:
        return "tiers: none (--host-cache-bytes 0, no --disk-cache-dir)"
    parts = [f"host {config.host_cache_bytes / 2**30:.2f} GiB"]
    if config.disk_cache_dir is not None:
        parts.append(f"disk {config.disk_cache_bytes / 2**30:.2f} GiB in {config.disk_cache_dir}")
    return "tiers: " + ", ".join(parts)


class EngineConfigs(NamedTuple):
    cache: CacheConfig
    scheduler: SchedulerConfig
    model: ModelConfig


def model_name(model: str | None, model_dir: str | None) -> str:
    """The name clients send: a directory's own name, a hub id as given, else the built-in's."""
    if model_dir is None:
        return ModelConfig.name
    return Path(model).name if Path(model).is_dir() else model


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    """`ValueError` naming the option for a `--model` that is no checkpoint directory. The
    name is `serve`'s `--model-name` when given."""
    model_dir = resolve_model_dir(args.model) if args.model else None
    if model_dir is not None and args.weights:
        raise ValueError("--weights is for the built-in model; a --model directory has its own")
    name = getattr(args, "model_name", None) or model_name(args.model, model_dir)
    return ModelConfig(
        name=name,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        weights_path=args.weights,
        model_dir=model_dir,
    )


def sized_pools(args: argparse.Namespace, cache: CacheConfig, model: ModelConfig) -> PoolSizes:
    """The pools `--kv-cache-memory` buys for `model` at `cache`'s block sizes."""
    if args.num_blocks is not None:
        raise ValueError("give --kv-cache-memory or --num-blocks, not both")
    from engine.model.build import resolve_device

    budget = parse_budget(args.kv_cache_memory)
    cost = footprint(model)
    num_bytes = budget_bytes(budget, str(resolve_device(model)), cost.weights_bytes)
    return size_pools(
        num_bytes,
        cost,
        cache.attention_block_size,
        cache.mamba_block_size,
        args.num_mamba_blocks,
    )


def _given(value: int | None, default: int | None) -> int | None:
    return default if value is None else value


def configs_from_args(args: argparse.Namespace) -> EngineConfigs:
    """The configs the options give; `ValueError` with the reason for bad ones."""
    model = model_config_from_args(args)
    cache = CacheConfig(
        block_size=args.block_size,
        mamba_block_size=args.mamba_block_size,
        prefix_match_unit=args.prefix_match_unit,
        dcp_size=args.dcp_size,
        num_blocks=_given(args.num_blocks, DEFAULT_NUM_BLOCKS),
        num_mamba_blocks=_given(args.num_mamba_blocks, args.default_num_mamba_blocks),
        pin_max_share=args.pin_max_share,
        enable_prefix_caching=not args.no_prefix_caching,
        partial_hits=not args.no_partial_hits,
        junction_checkpoints=args.junction_checkpoints,
        checkpoint_mode=args.checkpoint_mode,
        checkpoint_interval=args.checkpoint_interval,
        eagle=args.eagle,
        eviction=args.eviction,
    )
    if args.kv_cache_memory is not None:
        cache = replace(cache, **sized_pools(args, cache, model)._asdict())
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_threshold=args.long_prefill_threshold,
        max_prefix_wait_steps=args.max_prefix_wait_steps,
        **checkpoint_limits(model),
    )
    return EngineConfigs(cache, scheduler, model)


def checkpoint_limits(model: ModelConfig) -> dict[str, int]:
    """`max_model_len` from a checkpoint's config.json when it names a shorter one than the
    default: a request longer than the model's positions is refused, and the hello and model
    card report the checkpoint's own limit."""
    if model.model_dir is None:
        return {}
    longest = checkpoint_max_len(model.model_dir)
    if longest is None or longest >= SchedulerConfig.max_model_len:
        return {}
    return {"max_model_len": longest}
