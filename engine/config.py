"""Frozen configuration of the engine, one dataclass per concern.

Sizes follow docs/rules.md section 2: attention block `Ba` (times the DCP size `D`), Mamba block
`Bm`, match unit `U`. Validation raises `ValueError` naming the offending numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from engine.cache.eviction import DEFAULT_EVICTION, check_eviction

CheckpointMode = Literal["stops", "inline"]
CHECKPOINT_MODES: tuple[str, ...] = ("stops", "inline")

# The cache and step defaults (docs/rules.md section 2), declared once: the configs below, the
# command-line flags (engine.setup.options) and the benchmark geometries read these.
DEFAULT_BLOCK_SIZE = 16  # Ba
DEFAULT_MAMBA_BLOCK_SIZE = 512  # Bm
DEFAULT_NUM_BLOCKS = 4096  # blocks per group
#: Mamba slots `junction serve` defaults to: 512 keep the built-in's state pool near 200 MB
DEFAULT_SERVE_NUM_MAMBA_BLOCKS = 512
DEFAULT_PIN_MAX_SHARE = 0.25
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: tokens between interval states when `checkpoint_interval` is not given (rounded up to `U`)
DEFAULT_CHECKPOINT_INTERVAL = 64


def _require_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    """Geometry and policy of the two cache groups.

    `prefix_match_unit` defaults to the gcd of the group block sizes (the attention block
    scaled by `dcp_size`, and the Mamba block).
    """

    block_size: int = DEFAULT_BLOCK_SIZE
    mamba_block_size: int = DEFAULT_MAMBA_BLOCK_SIZE
    prefix_match_unit: int | None = None
    dcp_size: int = 1
    num_blocks: int = DEFAULT_NUM_BLOCKS
    num_mamba_blocks: int | None = None
    enable_prefix_caching: bool = True
    partial_hits: bool = True
    junction_checkpoints: bool = True
    checkpoint_mode: CheckpointMode = "inline"
    # inline: a spare Mamba state every this many tokens, kept only in free blocks that hold
    # nothing retained longer (0: none; None: DEFAULT_CHECKPOINT_INTERVAL rounded up to U)
    checkpoint_interval: int | None = None
    eagle: bool = False
    pin_max_share: float = DEFAULT_PIN_MAX_SHARE
    # which free block an allocation gives up: a name in `engine.cache.eviction`'s registry
    eviction: str = DEFAULT_EVICTION

    def __post_init__(self) -> None:
        _require_positive("block_size", self.block_size)
        _require_positive("mamba_block_size", self.mamba_block_size)
        _require_positive("dcp_size", self.dcp_size)
        _require_positive("num_blocks", self.num_blocks)
        if self.num_mamba_blocks is not None:
            _require_positive("num_mamba_blocks", self.num_mamba_blocks)
        if self.checkpoint_mode not in CHECKPOINT_MODES:
            raise ValueError(
                f"checkpoint_mode must be one of {', '.join(CHECKPOINT_MODES)}, "
                f"got {self.checkpoint_mode!r}"
            )
        if self.checkpoint_interval is not None and self.checkpoint_interval < 0:
            raise ValueError(
                f"checkpoint_interval must be >= 0 (0 turns interval states off), "
                f"got {self.checkpoint_interval}"
            )
        check_eviction(self.eviction)
        if not 0.0 <= self.pin_max_share <= 1.0:
            raise ValueError(f"pin_max_share must lie in [0, 1], got {self.pin_max_share}")
        unit = self.match_unit
        if unit <= 0 or self.attention_block_size % unit or self.mamba_block_size % unit:
            raise ValueError(
                f"prefix_match_unit {unit} must divide the attention block size "
                f"{self.attention_block_size} and the Mamba block size {self.mamba_block_size}"
            )
        if self.checkpoint_interval is not None and self.checkpoint_interval % unit:
            raise ValueError(
                f"checkpoint_interval {self.checkpoint_interval} must be a multiple of the "
                f"match unit {unit} (states elsewhere can never be hit)"
            )

    @property
    def attention_block_size(self) -> int:
        """Tokens per attention block: `Ba * D` under decode context parallelism."""
        return self.block_size * self.dcp_size

    @property
    def match_unit(self) -> int:
        if self.prefix_match_unit is None:
            return math.gcd(self.attention_block_size, self.mamba_block_size)
        return self.prefix_match_unit

    @property
    def is_fine_grained(self) -> bool:
        """Partial hits are on and some block is larger than the match unit."""
        unit = self.match_unit
        return self.partial_hits and (
            unit < self.attention_block_size or unit < self.mamba_block_size
        )

    @property
    def scheduler_block_size(self) -> int:
        """`S`: where budget-limited chunks end, and where hits land with partial hits off."""
        if self.partial_hits:
            return self.mamba_block_size
        return math.lcm(self.attention_block_size, self.mamba_block_size)

    @property
    def hit_alignment(self) -> int:
        """The grid every hit length lies on."""
        return self.match_unit if self.is_fine_grained else self.scheduler_block_size

    @property
    def eagle_drop(self) -> int:
        """Tokens EAGLE drops from an attention hit: one unit, or one block when coarse."""
        if not self.eagle:
            return 0
        return self.match_unit if self.is_fine_grained else self.attention_block_size

    @property
    def state_interval(self) -> int:
        """The interval states are written at: only inline, with fine-grained hits and the
        cache on (elsewhere no hit can land between block boundaries); 0 when off."""
        if (
            self.checkpoint_mode != "inline"
            or not self.is_fine_grained
            or not self.enable_prefix_caching
        ):
            return 0
        if self.checkpoint_interval is None:
            return -(-DEFAULT_CHECKPOINT_INTERVAL // self.match_unit) * self.match_unit
        return self.checkpoint_interval

    @property
    def mamba_num_blocks(self) -> int:
        return self.num_mamba_blocks if self.num_mamba_blocks is not None else self.num_blocks


@dataclass(frozen=True)
class SchedulerConfig:
    """Token budget and queue limits of one engine step."""

    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = 256
    long_prefill_threshold: int = 0
    max_model_len: int = 1 << 20
    # steps a waiting request may wait for a request in flight that is computing its prefix
    max_prefix_wait_steps: int = 32

    def __post_init__(self) -> None:
        _require_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _require_positive("max_num_seqs", self.max_num_seqs)
        _require_positive("max_model_len", self.max_model_len)
        if self.max_prefix_wait_steps < 0:
            raise ValueError(
                f"max_prefix_wait_steps must be >= 0 (0 turns waiting off), "
                f"got {self.max_prefix_wait_steps}"
            )
        if self.long_prefill_threshold < 0:
            raise ValueError(
                f"long_prefill_threshold must be >= 0 (0 turns it off), "
                f"got {self.long_prefill_threshold}"
            )

    @property
    def chunk_limit(self) -> int:
        """The most prompt tokens one request may prefill in one step."""
        if self.long_prefill_threshold:
            return min(self.max_num_batched_tokens, self.long_prefill_threshold)
        return self.max_num_batched_tokens


DISK_ADMISSIONS: tuple[str, ...] = ("all", "policy")


@dataclass(frozen=True)
class TierConfig:
    """The tiers under the device pools (`engine.tiers`, docs/rules.md section 16): host memory
    of `host_cache_bytes` (0: none) over an optional disk directory of `disk_cache_bytes`.
    The rates, when given, price a load against the prefill it saves; without them every
    load is taken."""

    host_cache_bytes: int = 0
    disk_cache_dir: str | None = None
    disk_cache_bytes: int = 0
    host_bytes_per_s: float | None = None
    disk_bytes_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    # what host memory gives up goes to disk: "all" of it, or only what the Mamba pool's
    # eviction policy says is worth a tier ("policy"; `Demotes`), which lost up to 4 points of
    # hits with host 2x over a disk in `benchmarks/tiers.py` and gained none
    disk_admission: str = "all"

    def __post_init__(self) -> None:
        if self.disk_admission not in DISK_ADMISSIONS:
            raise ValueError(
                f"disk_admission must be one of {', '.join(DISK_ADMISSIONS)}, "
                f"got {self.disk_admission!r}"
            )
        for name in ("host_cache_bytes", "disk_cache_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.disk_cache_dir is not None and self.disk_cache_bytes <= 0:
            raise ValueError(
                f"disk_cache_dir {self.disk_cache_dir!r} needs disk_cache_bytes > 0 "
                "(--disk-cache-bytes, JUNCTION_DISK_CACHE_BYTES)"
            )
        for name in ("host_bytes_per_s", "disk_bytes_per_s", "prefill_tokens_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 when given, got {value!r}")

    @property
    def is_enabled(self) -> bool:
        return self.host_cache_bytes > 0 or self.disk_cache_dir is not None


@dataclass(frozen=True)
class ModelConfig:
    """The hybrid model's shape. The `null` and `ledger` runners read only `vocab_size`.

    `model_dir`, a local Hugging Face checkpoint directory, replaces the built-in model: its
    config.json then gives the shape, and the shape fields here are not read by the torch runner.
    """

    name: str = "junction-hybrid-tiny"
    vocab_size: int = 258
    num_layers: int = 8
    num_attention_layers: int = 2
    d_model: int = 256
    num_heads: int = 8
    num_kv_heads: int = 2
    seed: int = 0
    dtype: str = "float32"
    device: str | None = None
    weights_path: str | None = None
    model_dir: str | None = None
    extra: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads"):
            _require_positive(name, getattr(self, name))
        if not 0 <= self.num_attention_layers <= self.num_layers:
            raise ValueError(
                f"num_attention_layers {self.num_attention_layers} must lie in "
                f"[0, num_layers {self.num_layers}]"
            )
        if self.d_model % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"d_model {self.d_model} must be divisible by num_heads {self.num_heads}, "
                f"and num_heads by num_kv_heads {self.num_kv_heads}"
            )
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
