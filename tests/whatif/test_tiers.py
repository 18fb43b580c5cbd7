"""A what-if with tiers below the device: host memory and a model of the disk tier give, request
by request and tier by tier, what a real replay with those tiers (a disk directory) gives."""

from __future__ import annotations

import pytest
import torch

from engine.config import CacheConfig, ModelConfig, SchedulerConfig, TierConfig
from engine.engine import Engine
from engine.runners.null import sized
from engine.setup.footprint import footprint
from engine.tiers.codec import encode
from engine.tiers.disk import DiskTier
from engine.tiers.unit import TierUnit
from engine.traces.replay import replay
from tests.whatif.test_run import record
from whatif.run import run_whatif
from whatif.settings import WhatIfSetting, apply, parse_settings
from whatif.tier_table import tier_curve
from whatif.tiers import ModelDisk, model_stack, unit_file_bytes
from workloads import build_workload

MIB = 1 << 20


@pytest.mark.parametrize(
    ("start", "end", "parent"),
    [(0, 16, None), (1600, 3200, b"\x02" * 16), (99_984, 100_000, b"\x03" * 16), (0, 7, None)],
)
def test_a_units_file_length_is_counted_without_writing_it(start, end, parent):
    unit = TierUnit(
        b"\x01" * 16, parent, start, end, ({"kv": sized((end - start) * 1024)},),
        {"state": sized(434_688)},
    )  # fmt: skip
    assert unit_file_bytes(unit) == len(encode(unit))
    torch_unit = TierUnit(
        b"\x04" * 16, parent, start, end,
        ({"k.0": torch.zeros(2, 3), "v.0": torch.zeros(5, dtype=torch.bfloat16)},
         {"k.0": torch.zeros(1, dtype=torch.int64)}),
        {"conv.0": torch.zeros(4, 4), "ssm.0": torch.zeros(3, dtype=torch.uint8)},
    )  # fmt: skip
    assert unit_file_bytes(torch_unit) == len(encode(torch_unit))


def test_the_disk_model_keeps_and_gives_up_what_a_directory_does(tmp_path):
    """The same puts and gets on a real disk tier and on the model: the same units held, the
    same bytes, the same evictions."""
    real = DiskTier(tmp_path, 6 * MIB, {"test": 1})
    model = ModelDisk(6 * MIB)
    parent, start = None, 0
    for index in range(12):
        key = bytes([index + 1]) * 16
        unit = TierUnit(
            key, parent, start, start + 512, ({"kv": sized(512 * 1024)},),
            {"state": sized(434_688)},
        )  # fmt: skip
        assert real.put(unit) == model.put(unit)
        if index % 3 == 0:
            assert (real.get(bytes([1]) * 16) is None) == (model.get(bytes([1]) * 16) is None)
        parent, start = (key, start + 512) if index % 4 != 3 else (None, 0)
    assert real.keys() == model.keys()
    assert real.stats() == model.stats()
    model.check_invariants()


#: a small model, so that the real replay's disk files are small: its unit bytes are a setting
SMALL = ModelConfig(num_layers=2, num_attention_layers=1, d_model=32, num_heads=2, num_kv_heads=1)
KIB = 1 << 10


def real_replay(items, cache: CacheConfig, window: int, host: int, disk: int, directory):
    tiers = TierConfig(
        host_cache_bytes=host,
        disk_cache_dir=str(directory) if disk else None,
        disk_cache_bytes=disk,
    )
    engine = Engine(cache, SchedulerConfig(), SMALL, runner="null", tiers=tiers)
    records, _ = replay(engine, items, concurrency=window)
    requests = [r for r in records if r["type"] == "request"]
    by_tier = [r["hit_tokens_by_medium"] for r in requests]
    return [r["num_cached_tokens"] for r in requests], [
        [t.get("host", 0), t.get("disk", 0)] for t in by_tier
    ]


#: (workload, with pins, replay window, attention blocks, Mamba slots): device pools short
MULTI_TURN = {"kind": "multi_turn", "num_users": 6, "num_rounds": 4, "system_prompt_len": 400,
              "user_history_len": 600}  # fmt: skip
AGENTIC = {"kind": "agentic", "num_sessions": 3, "num_steps": 6, "system_prompt_len": 800,
           "tool_output_len": 300}  # fmt: skip
TRACES = [(MULTI_TURN, True, 4, 300, 16), (AGENTIC, False, 4, 300, 16)]
TIER_SIZES = [(160 * KIB, 0), (0, 640 * KIB), (80 * KIB, 1280 * KIB), (5 * MIB, 0)]


@pytest.mark.parametrize(("spec", "pins", "window", "blocks", "states"), TRACES)
def test_a_whatif_with_tiers_equals_a_real_replay_with_them_request_by_request(
    spec, pins, window, blocks, states, tmp_path
):
    items = build_workload(spec).items(with_pins=pins)
    cache = CacheConfig(num_blocks=blocks, num_mamba_blocks=states)
    recording, _ = record(items, cache, window, window)
    token_bytes, state_bytes = footprint(SMALL)[3:5]
    tried = parse_settings(
        [
            {"host_cache_bytes": h, "disk_cache_bytes": d, "token_bytes": token_bytes,
             "state_bytes": state_bytes}
            for h, d in TIER_SIZES
        ]
    )  # fmt: skip
    report = run_whatif(recording, tried)
    served = {"host": 0, "disk": 0}
    for index, (setting, result) in enumerate(zip(tried, report.results, strict=True)):
        host, disk = setting.tier_bytes()
        hits, by_tier = real_replay(
            items, apply(setting, cache, 16), window, host, disk, tmp_path / str(index)
        )
        assert result.hits == hits, setting
        assert result.tier_hits == by_tier, setting
        assert result.host_hit_tokens == sum(h for h, _ in by_tier)
        assert result.disk_hit_tokens == sum(d for _, d in by_tier)
        served["host"] += result.host_hit_tokens
        served["disk"] += result.disk_hit_tokens
    # the tiers served hits the device pools alone did not: the comparison saw both tiers work
    assert served["host"] > 0 and served["disk"] > 0
    assert max(r.hit_tokens for r in report.results) > report.as_ran.hit_tokens


def test_tier_settings_are_checked_and_named():
    setting = WhatIfSetting(host_cache_bytes=64 << 30, disk_cache_bytes=0)
    assert setting.name() == "host 64 GiB, disk 0 B"
    assert setting.tier_bytes() == (64 << 30, 0)
    assert apply(setting, CacheConfig(), 16) == CacheConfig()  # the device is untouched
    with pytest.raises(ValueError, match="host_cache_bytes"):
        parse_settings([{"host_cache_bytes": -1}])
    assert model_stack(0, 0) is None


def test_the_host_curve_at_rate_one_is_exact_replays():
    items = build_workload(MULTI_TURN).items()
    cache = CacheConfig(num_blocks=300, num_mamba_blocks=16)
    recording, _ = record(items, cache, 4, 4)
    sizes = [0, 2 * MIB, 64 * MIB]
    points = tier_curve(recording, cache, SchedulerConfig(), "host", sizes, 1.0)
    report = run_whatif(recording, [WhatIfSetting(host_cache_bytes=s) for s in sizes])
    for point, result in zip(points, report.results, strict=True):
        assert point.hit_rate == pytest.approx(result.hit_rate)
        assert point.by_tier["host"] == pytest.approx(
            result.host_hit_tokens / result.num_prompt_tokens
        )
    assert points[-1].hit_rate > points[0].hit_rate  # host memory buys hits here
    with pytest.raises(ValueError, match="tier must be"):
        tier_curve(recording, cache, SchedulerConfig(), "tape", sizes, 1.0)
