"""A benchmark run's spec: a workload, the engine's settings, a runner and the modes to replay.

    {"name": "gsp-small",
     "workload": {"kind": "generated_shared_prefix", "seed": 0, "num_groups": 8},
     "runner": "ledger",
     "modes": ["off", "aligned", "partial", "junction", "junction_inline", "pins"],
     "geometry": {"block_size": 16, "mamba_block_size": 512, "num_blocks": 4096},
     "concurrency": 8}

`geometry` holds the engine's cache and step settings (`EngineSettings`); the key keeps its
name because specs are stored with runs and posted to `POST /api/v1/benchmarks`. A spec that
omits `geometry` or `concurrency` takes the workload's suggestion (the seed cases carry the
settings of their seed). Bad input raises pydantic's `ValidationError`, naming the
field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.cache.eviction import DEFAULT_EVICTION, check_eviction
from engine.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAMBA_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_NUM_BLOCKS,
    DEFAULT_PIN_MAX_SHARE,
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
)
from engine.modes import MODES, Mode, RunnerName
from engine.setup.model_dir import resolve_model_dir
from workloads import WorkloadParams, WorkloadSpec, parse_workload

Runner = RunnerName


class EngineSettings(BaseModel):
    """The engine's cache and scheduler settings, as `junction replay`'s options set them (a
    spec's `geometry`)."""

    model_config = ConfigDict(extra="forbid")

    block_size: int = DEFAULT_BLOCK_SIZE
    mamba_block_size: int = DEFAULT_MAMBA_BLOCK_SIZE
    prefix_match_unit: int | None = None
    dcp_size: int = 1
    eagle: bool = False
    num_blocks: int = DEFAULT_NUM_BLOCKS
    num_mamba_blocks: int | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    long_prefill_threshold: int = 0
    pin_max_share: float = DEFAULT_PIN_MAX_SHARE
    eviction: str = DEFAULT_EVICTION  # a name in `EVICTION_NAMES` (docs/rules.md section 12)

    @field_validator("eviction")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        return check_eviction(name)

    @model_validator(mode="after")
    def _valid(self) -> EngineSettings:
        self.cache_config()  # raises ValueError naming the numbers
        self.scheduler_config()
        return self

    def cache_config(self, **options) -> CacheConfig:
        """The cache config of these settings; `options` override its fields."""
        settings = {
            "block_size": self.block_size,
            "mamba_block_size": self.mamba_block_size,
            "prefix_match_unit": self.prefix_match_unit,
            "dcp_size": self.dcp_size,
            "eagle": self.eagle,
            "num_blocks": self.num_blocks,
            "num_mamba_blocks": self.num_mamba_blocks,
            "pin_max_share": self.pin_max_share,
            "eviction": self.eviction,
        }
        return CacheConfig(**{**settings, **options})

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            long_prefill_threshold=self.long_prefill_threshold,
        )

    @property
    def match_unit(self) -> int:
        return self.cache_config().match_unit


class ModelOptions(BaseModel):
    """The torch runner's model; the other runners read none of it. `model_dir` is a Hugging
    Face-format checkpoint directory (or a hub id in the local cache), as `--model` takes;
    without it the built-in model runs, from `seed` or `weights_path`."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    device: str | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    weights_path: str | None = None
    model_dir: str | None = None

    @field_validator("model_dir")
    @classmethod
    def _local(cls, value: str | None) -> str | None:
        return None if value is None else resolve_model_dir(value, option="model.model_dir")

    def to_model_config(self) -> ModelConfig:
        return ModelConfig(
            seed=self.seed,
            device=self.device,
            dtype=self.dtype,
            weights_path=self.weights_path,
            model_dir=self.model_dir,
        )


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=200)]
    workload: WorkloadSpec
    runner: Runner = "ledger"
    modes: Annotated[list[Mode], Field(min_length=1)] = list(MODES)
    # the engine's settings: the JSON key stays `geometry` (stored runs, the REST API's bodies)
    geometry: EngineSettings = EngineSettings()
    concurrency: Annotated[int, Field(ge=1, le=4096)] = 8
    model: ModelOptions = ModelOptions()

    @model_validator(mode="before")
    @classmethod
    def _workload_suggestions(cls, data: object) -> object:
        """A spec without geometry or concurrency takes the workload's suggestion."""
        if not isinstance(data, dict) or not isinstance(
            data.get("workload"), dict | WorkloadParams
        ):
            return data
        try:
            params = parse_workload(data["workload"])
        except ValueError:
            return data  # the field's own validation reports it
        data = dict(data)
        if "geometry" not in data:
            data["geometry"] = dict(params.suggested_settings)
        if "concurrency" not in data:
            data["concurrency"] = params.suggested_concurrency
        return data

    @field_validator("modes")
    @classmethod
    def _unique_modes(cls, modes: list[str]) -> list[str]:
        repeated = sorted({m for m in modes if modes.count(m) > 1})
        if repeated:
            raise ValueError(f"modes repeat: {', '.join(repeated)}")
        return modes

    @model_validator(mode="after")
    def _requests_fit(self) -> BenchmarkSpec:
        """Every request must fit the pools: say so now, not half-way through a run."""
        cache = self.geometry.cache_config()
        longest = self.workload.max_sequence_len()
        needs = {
            "num_blocks": (-(-longest // cache.attention_block_size) + 1, cache.num_blocks),
            "num_mamba_blocks": (
                -(-longest // cache.mamba_block_size) + 5,
                cache.mamba_num_blocks,
            ),
        }
        for name, (need, have) in needs.items():
            if need > have:
                raise ValueError(
                    f"the workload's longest request ({longest} prompt + output tokens) needs "
                    f"{need} blocks but geometry.{name} gives {have}: raise geometry.{name}"
                )
        return self
