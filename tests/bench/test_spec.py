"""`BenchmarkSpec`: defaults, the workload's suggestions, and bad input named clearly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bench import MODES, BenchmarkSpec


def test_defaults_and_the_documented_shape():
    spec = BenchmarkSpec.model_validate(
        {
            "name": "gsp-small",
            "workload": {"kind": "generated_shared_prefix", "seed": 0, "num_groups": 2},
            "runner": "ledger",
            "modes": ["off", "aligned", "partial", "junction", "junction_inline", "pins"],
            "geometry": {
                "block_size": 16,
                "mamba_block_size": 512,
                "prefix_match_unit": None,
                "dcp_size": 1,
                "eagle": False,
                "num_blocks": 4096,
                "num_mamba_blocks": None,
                "max_num_batched_tokens": 8192,
                "long_prefill_threshold": 0,
            },
            "concurrency": 8,
        }
    )
    assert spec.workload.num_groups == 2 and spec.workload.prompts_per_group == 16
    assert spec.geometry.match_unit == 16 and spec.concurrency == 8
    minimal = BenchmarkSpec.model_validate({"name": "m", "workload": {"kind": "agentic"}})
    assert minimal.modes == list(MODES) and minimal.runner == "ledger"
    assert BenchmarkSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_seed_cases_bring_their_geometry_unless_the_spec_gives_one():
    spec = BenchmarkSpec.model_validate({"name": "d", "workload": {"kind": "seed_dcp"}})
    assert (spec.geometry.block_size, spec.geometry.dcp_size, spec.geometry.match_unit) == (
        1536,
        8,
        1536,
    )
    assert spec.concurrency == 1
    eagle = BenchmarkSpec.model_validate({"name": "e", "workload": {"kind": "seed_eagle_resend"}})
    assert eagle.geometry.eagle and eagle.geometry.match_unit == 128
    given = BenchmarkSpec.model_validate(
        {
            "name": "e",
            "workload": {"kind": "seed_eagle_resend", "prompt_len": 512},
            "geometry": {"block_size": 32},
            "concurrency": 3,
        }
    )
    assert not given.geometry.eagle and given.geometry.block_size == 32 and given.concurrency == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": ""}, "name"),
        ({"workload": {"kind": "bogus"}}, "does not match any of the expected tags"),
        ({"modes": ["partial", "fast"]}, "modes.1"),
        ({"modes": []}, "at least 1 item"),
        ({"modes": ["off", "off"]}, "modes repeat: off"),
        ({"runner": "gpu"}, "'null', 'ledger' or 'torch'"),
        ({"concurrency": 0}, "greater than or equal to 1"),
        ({"geometry": {"prefix_match_unit": 5}}, "prefix_match_unit 5 must divide"),
        ({"geometry": {"block_size": 0}}, "block_size must be a positive integer"),
        ({"geometry": {"num_blocks": 8}}, "raise geometry.num_blocks"),
        ({"geometry": {"colour": 1}}, "Extra inputs are not permitted"),
        ({"surprise": True}, "Extra inputs are not permitted"),
    ],
)
def test_bad_specs_name_what_is_wrong(change, message):
    obj = {"name": "x", "workload": {"kind": "generated_shared_prefix", "num_groups": 1}, **change}
    with pytest.raises(ValidationError) as error:
        BenchmarkSpec.model_validate(obj)
    assert message in str(error.value)
