"""CacheConfig, SchedulerConfig and ModelConfig: sizes, derived geometry and validation."""

from __future__ import annotations

import re

import pytest

from engine.config import CacheConfig, ModelConfig, SchedulerConfig


def _numbers(message: str) -> set[int]:
    return {int(n) for n in re.findall(r"-?\d+", message)}


# ------------------------------------------------------------------ match unit


@pytest.mark.parametrize(
    ("block_size", "mamba_block_size", "dcp_size", "unit"),
    [
        (16, 512, 1, 48),  # divides neither block
        (16, 512, 1, 32),  # divides Bm, not Ba
        (96, 512, 1, 96),  # divides Ba, not Bm
        (16, 512, 2, 64),  # divides Bm, not Ba * D = 32
    ],
)
def test_unit_that_does_not_divide_a_block_names_all_three_numbers(
    block_size: int, mamba_block_size: int, dcp_size: int, unit: int
) -> None:
    with pytest.raises(ValueError) as info:
        CacheConfig(
            block_size=block_size,
            mamba_block_size=mamba_block_size,
            dcp_size=dcp_size,
            prefix_match_unit=unit,
        )
    numbers = _numbers(str(info.value))
    assert {unit, block_size * dcp_size, mamba_block_size} <= numbers


def test_unit_that_divides_both_blocks_is_accepted() -> None:
    config = CacheConfig(block_size=64, mamba_block_size=512, prefix_match_unit=32)
    assert config.match_unit == 32


def test_unit_zero_is_rejected() -> None:
    with pytest.raises(ValueError):
        CacheConfig(prefix_match_unit=0)


@pytest.mark.parametrize(
    ("block_size", "mamba_block_size", "dcp_size", "expected"),
    [
        (16, 512, 1, 16),
        (48, 512, 1, 16),
        (48, 512, 2, 32),  # gcd(96, 512): the attention block is scaled by D first
        (768, 512, 1, 256),
        (512, 512, 1, 512),
        (16, 512, 4, 64),
    ],
)
def test_default_match_unit_is_gcd_of_group_block_sizes(
    block_size: int, mamba_block_size: int, dcp_size: int, expected: int
) -> None:
    config = CacheConfig(
        block_size=block_size, mamba_block_size=mamba_block_size, dcp_size=dcp_size
    )
    assert config.match_unit == expected


def test_dcp_scales_attention_block_only() -> None:
    config = CacheConfig(block_size=16, mamba_block_size=512, dcp_size=4)
    assert config.attention_block_size == 64
    assert config.mamba_block_size == 512


def test_dcp_scaling_lets_a_larger_unit_divide_the_attention_block() -> None:
    with pytest.raises(ValueError):
        CacheConfig(block_size=16, mamba_block_size=512, dcp_size=1, prefix_match_unit=32)
    config = CacheConfig(block_size=16, mamba_block_size=512, dcp_size=2, prefix_match_unit=32)
    assert config.attention_block_size == 32
    assert config.match_unit == 32


# ------------------------------------------------------------------ scheduler block, EAGLE


def test_scheduler_block_is_mamba_block_with_partial_hits_on() -> None:
    config = CacheConfig(block_size=768, mamba_block_size=512, partial_hits=True)
    assert config.scheduler_block_size == 512


def test_scheduler_block_is_lcm_with_partial_hits_off() -> None:
    config = CacheConfig(block_size=768, mamba_block_size=512, partial_hits=False)
    assert config.scheduler_block_size == 1536


def test_scheduler_block_lcm_uses_dcp_scaled_attention_block() -> None:
    config = CacheConfig(block_size=384, mamba_block_size=512, dcp_size=2, partial_hits=False)
    assert config.scheduler_block_size == 1536  # lcm(768, 512)


def test_fine_grained_when_unit_smaller_than_a_block() -> None:
    assert CacheConfig(block_size=16, mamba_block_size=512).is_fine_grained
    assert CacheConfig(block_size=512, mamba_block_size=512, prefix_match_unit=256).is_fine_grained
    assert not CacheConfig(block_size=512, mamba_block_size=512).is_fine_grained
    assert not CacheConfig(block_size=16, mamba_block_size=512, partial_hits=False).is_fine_grained


def test_eagle_drop_is_one_unit_when_fine_grained() -> None:
    config = CacheConfig(block_size=64, mamba_block_size=512, prefix_match_unit=32, eagle=True)
    assert config.eagle_drop == 32


def test_eagle_drop_is_one_attention_block_when_partial_hits_off() -> None:
    config = CacheConfig(
        block_size=64, mamba_block_size=512, prefix_match_unit=32, eagle=True, partial_hits=False
    )
    assert config.eagle_drop == 64


def test_eagle_drop_is_one_attention_block_when_unit_equals_blocks() -> None:
    config = CacheConfig(block_size=128, mamba_block_size=256, dcp_size=2, eagle=True)
    assert not config.is_fine_grained
    assert config.eagle_drop == 256


def test_eagle_drop_is_zero_without_eagle() -> None:
    assert CacheConfig(block_size=64, mamba_block_size=512, eagle=False).eagle_drop == 0
    assert CacheConfig(block_size=64, partial_hits=False, eagle=False).eagle_drop == 0


# ------------------------------------------------------------------ other cache validation


def test_bad_checkpoint_mode_is_rejected_with_its_value() -> None:
    with pytest.raises(ValueError, match="bogus"):
        CacheConfig(checkpoint_mode="bogus")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["stops", "inline"])
def test_known_checkpoint_modes_are_accepted(mode: str) -> None:
    assert CacheConfig(checkpoint_mode=mode).checkpoint_mode == mode  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"block_size": -16},
        {"block_size": 16.0},
        {"block_size": True},
        {"mamba_block_size": 0},
        {"dcp_size": 0},
        {"num_blocks": 0},
        {"num_mamba_blocks": 0},
        {"pin_max_share": 1.5},
        {"pin_max_share": -0.1},
    ],
)
def test_bad_cache_sizes_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        CacheConfig(**kwargs)


def test_mamba_num_blocks_defaults_to_num_blocks() -> None:
    assert CacheConfig(num_blocks=100).mamba_num_blocks == 100
    assert CacheConfig(num_blocks=100, num_mamba_blocks=7).mamba_num_blocks == 7


def test_cache_config_is_frozen() -> None:
    config = CacheConfig()
    with pytest.raises(AttributeError):
        config.block_size = 32  # type: ignore[misc]


# ------------------------------------------------------------------ scheduler config


@pytest.mark.parametrize(
    ("budget", "threshold", "expected"),
    [
        (8192, 0, 8192),  # threshold off
        (8192, 2048, 2048),
        (8192, 10000, 8192),
        (1000, 1000, 1000),
    ],
)
def test_chunk_limit_is_min_of_budget_and_long_prefill_threshold(
    budget: int, threshold: int, expected: int
) -> None:
    config = SchedulerConfig(max_num_batched_tokens=budget, long_prefill_threshold=threshold)
    assert config.chunk_limit == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"long_prefill_threshold": -1},
        {"max_num_batched_tokens": 0},
        {"max_num_seqs": 0},
        {"max_model_len": 0},
    ],
)
def test_bad_scheduler_config_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(**kwargs)


def test_negative_threshold_message_names_the_value() -> None:
    with pytest.raises(ValueError, match="-5"):
        SchedulerConfig(long_prefill_threshold=-5)


# ------------------------------------------------------------------ model config


def test_default_model_config_is_valid() -> None:
    config = ModelConfig()
    assert config.num_attention_layers <= config.num_layers


@pytest.mark.parametrize(
    ("kwargs", "numbers"),
    [
        ({"num_layers": 4, "num_attention_layers": 5}, {4, 5}),
        ({"num_attention_layers": -1}, {-1, 8}),
        ({"d_model": 250, "num_heads": 8}, {250, 8}),
        ({"num_heads": 8, "num_kv_heads": 3}, {8, 3}),
    ],
)
def test_bad_model_shape_names_the_numbers(kwargs: dict, numbers: set[int]) -> None:
    with pytest.raises(ValueError) as info:
        ModelConfig(**kwargs)
    assert numbers <= _numbers(str(info.value))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"vocab_size": 0},
        {"num_layers": 0},
        {"d_model": -256},
        {"num_heads": 0},
        {"num_kv_heads": 0},
        {"dtype": "float16"},
    ],
)
def test_bad_model_config_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ModelConfig(**kwargs)


def test_model_config_accepts_zero_and_all_attention_layers() -> None:
    assert ModelConfig(num_layers=4, num_attention_layers=0).num_attention_layers == 0
    assert ModelConfig(num_layers=4, num_attention_layers=4).num_attention_layers == 4
