"""A what-if setting: what to change from the settings the engine ran with.

Every field left out keeps the engine's own value, so `{}` replays what ran. `mode` lays a
benchmark mode's policy fields (`engine.modes`) on top, or `vllm`: vLLM's own rules as Junction
models them (hits only where attention and Mamba blocks align, no junction states, LRU
eviction). A unit finer than the recording's cannot be tried: its hashes say nothing about
prefixes that part inside one of its units.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.cache.eviction import EVICTION_NAMES
from engine.config import CacheConfig, SchedulerConfig
from engine.events import ATTENTION, MAMBA
from engine.geometry import CacheGeometry
from engine.modes import MODE_CACHE_OPTIONS, MODES
from engine.scheduling.capacity import blocks_needed

WHATIF_MODES: tuple[str, ...] = (*(m for m in MODES if m != "pins"), "vllm")
#: vLLM's prefix caching for hybrid models as the benchmarks' peer model has it
VLLM_OPTIONS = {**MODE_CACHE_OPTIONS["aligned"], "eviction": "lru"}
MAX_TOKENS = 1 << 20
#: 4,194,304 blocks a pool, past any engine's; what a run may hold is `whatif.budget`'s bound
MAX_BLOCKS = 1 << 22

#: 1 PiB, past any tier's; the what-if holds no tier's bytes (`whatif.tiers`)
MAX_TIER_BYTES = 1 << 50
#: the fields of a setting that size the tiers below the device, not the cache config
TIER_FIELDS = ("host_cache_bytes", "disk_cache_bytes", "token_bytes", "state_bytes")

Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
Blocks = Annotated[int, Field(gt=0, le=MAX_BLOCKS)]
TierBytes = Annotated[int, Field(ge=0, le=MAX_TIER_BYTES)]
UnitBytes = Annotated[int, Field(gt=0, le=MAX_TOKENS << 10)]


class WhatIfSetting(BaseModel):
    """One setting to try; `None` keeps what the engine ran with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: Annotated[str, Field(max_length=120)] | None = None
    mode: Literal[WHATIF_MODES] | None = None  # type: ignore[valid-type]
    block_size: Tokens | None = None
    mamba_block_size: Tokens | None = None
    prefix_match_unit: Tokens | None = None
    checkpoint_interval: Annotated[int, Field(ge=0, le=MAX_TOKENS)] | None = None
    eviction: Literal[EVICTION_NAMES] | None = None  # type: ignore[valid-type]
    num_blocks: Blocks | None = None
    num_mamba_blocks: Blocks | None = None
    # the tiers below the device (docs/rules.md section 16), in bytes; none: no tier (a
    # recording does not say which tiers ran)
    host_cache_bytes: TierBytes | None = None
    disk_cache_bytes: TierBytes | None = None
    # what a unit of the model weighs in a tier: bytes per token of attention (every
    # attention layer's keys and values) and per Mamba state; none: the built-in model's
    token_bytes: UnitBytes | None = None
    state_bytes: UnitBytes | None = None

    def changes(self) -> dict:
        """The fields this setting sets (its label aside)."""
        return self.model_dump(exclude_none=True, exclude={"label"})

    def name(self) -> str:
        """Its label, else its changes in a few words ("as ran" for none)."""
        if self.label:
            return self.label
        words = {
            "block_size": "Ba",
            "mamba_block_size": "Bm",
            "prefix_match_unit": "U",
            "checkpoint_interval": "interval",
            "num_blocks": "blocks",
            "num_mamba_blocks": "states",
            "host_cache_bytes": "host",
            "disk_cache_bytes": "disk",
            "token_bytes": "B/token",
            "state_bytes": "B/state",
        }
        parts = [
            f"{words[k]} {size_text(v) if k.endswith('cache_bytes') else v}"
            if k in words
            else str(v)
            for k, v in self.changes().items()
        ]
        return ", ".join(parts) or "as ran"

    def tier_bytes(self) -> tuple[int, int]:
        """The host and disk tiers' bytes this setting replays with (0: none)."""
        return self.host_cache_bytes or 0, self.disk_cache_bytes or 0

    def unit_bytes(self) -> tuple[int, int] | None:
        """Bytes per token of attention and per state of a unit; None: the built-in model's."""
        if self.token_bytes is None and self.state_bytes is None:
            return None
        from whatif.tiers import default_unit_bytes

        token, state = default_unit_bytes()
        return self.token_bytes or token, self.state_bytes or state


def size_text(num_bytes: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if num_bytes >= 1 << shift:
            return f"{num_bytes / (1 << shift):.3g} {unit}"
    return f"{num_bytes} B"


def ran_configs(geometry: CacheGeometry) -> tuple[CacheConfig, SchedulerConfig]:
    """The cache and scheduler configs an engine with this hello geometry ran with (a field
    the hello leaves out keeps Junction's default)."""
    cache = {
        "block_size": geometry.block_size,
        "mamba_block_size": geometry.mamba_block_size,
        "prefix_match_unit": geometry.prefix_match_unit,
        "dcp_size": geometry.dcp_size,
        "num_blocks": geometry.group_num_blocks(ATTENTION),
        "num_mamba_blocks": geometry.group_num_blocks(MAMBA),
        "enable_prefix_caching": geometry.enable_prefix_caching,
        "partial_hits": geometry.partial_hits,
        "junction_checkpoints": geometry.junction_checkpoints,
        "checkpoint_mode": geometry.checkpoint_mode,
        "checkpoint_interval": geometry.checkpoint_interval,
        "eagle": geometry.eagle,
        "eviction": geometry.eviction,
        "pin_max_share": geometry.pin_max_share,
    }
    scheduler = {
        "max_num_batched_tokens": geometry.max_num_batched_tokens,
        "max_num_seqs": geometry.max_num_seqs,
        "long_prefill_threshold": geometry.long_prefill_threshold,
        "max_model_len": geometry.max_model_len,
        "max_prefix_wait_steps": geometry.max_prefix_wait_steps,
    }
    return (
        CacheConfig(**{k: v for k, v in cache.items() if v is not None}),
        SchedulerConfig(**{k: v for k, v in scheduler.items() if v is not None}),
    )


def apply(setting: WhatIfSetting, ran: CacheConfig, recorded_unit: int) -> CacheConfig:
    """The cache config `setting` gives on top of what ran; a `ValueError` names the field
    that cannot be tried and why."""
    changes = {k: v for k, v in setting.changes().items() if k not in TIER_FIELDS}
    mode = changes.pop("mode", None)
    options = dict(VLLM_OPTIONS if mode == "vllm" else MODE_CACHE_OPTIONS.get(mode, {}))
    if "block_size" in changes or "mamba_block_size" in changes:
        # new block sizes: the unit follows them unless the setting names one
        options["prefix_match_unit"] = None
    options.update(changes)
    try:
        config = dataclasses.replace(ran, **options)
    except ValueError as exc:
        raise ValueError(f"what-if setting {setting.name()!r}: {exc}") from exc
    if config.match_unit % recorded_unit:
        raise ValueError(
            f"what-if setting {setting.name()!r}: prefix_match_unit {config.match_unit} is not a "
            f"multiple of the recording's unit {recorded_unit}; the recorded hashes say nothing "
            f"finer, so choose block sizes and a unit that are multiples of {recorded_unit}"
        )
    return config


def check_memory(cache: CacheConfig, longest: int, pins: list[int], label: str) -> None:
    """`ValueError` naming the setting when its pools could not hold a request of `longest`
    prompt + output tokens even alone, beside pins of `pins` tokens (what the engine would
    refuse it for)."""
    needs = blocks_needed(max(longest, 1), cache, len(pins))
    needs[ATTENTION] += sum(-(-n // cache.attention_block_size) for n in pins)  # held pinned
    needs[MAMBA] += len(pins)  # each pin holds its boundary's state slot pinned
    has = {ATTENTION: cache.num_blocks, MAMBA: cache.mamba_num_blocks}
    for group, need in needs.items():
        if need > has[group]:
            field = "num_blocks" if group == ATTENTION else "num_mamba_blocks"
            raise ValueError(
                f"what-if setting {label!r}: the longest request ({longest} tokens) needs "
                f"{need} {group} blocks, but {field} is {has[group]}: raise {field}"
            )


def parse_settings(raw: list[dict]) -> list[WhatIfSetting]:
    """Settings from plain JSON; a `ValueError` names the setting and the field."""
    settings = []
    for index, item in enumerate(raw):
        try:
            settings.append(WhatIfSetting.model_validate(item))
        except ValidationError as exc:
            fields = "; ".join(_problem(e) for e in exc.errors())
            raise ValueError(f"what-if setting {index}: {fields}") from exc
    return settings


def _problem(error: dict) -> str:
    where = ".".join(map(str, error["loc"])) or "setting"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field (fields: {', '.join(WhatIfSetting.model_fields)})"
    return f"{where}: {error['msg']}"
