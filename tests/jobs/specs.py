"""Benchmark specs small enough for a test: a few requests on the ledger runner."""

from __future__ import annotations

from typing import Any


def tiny_spec(name: str = "tiny-gsp", **overrides: Any) -> dict[str, Any]:
    """Two groups of three questions on a 256-token system prompt; four modes."""
    spec = {
        "name": name,
        "workload": {
            "kind": "generated_shared_prefix",
            "seed": 0,
            "num_groups": 2,
            "prompts_per_group": 3,
            "system_prompt_len": 256,
            "question_len": 32,
            "output_len": 4,
        },
        "runner": "ledger",
        "modes": ["off", "partial", "junction_inline", "pins"],
        "geometry": {"block_size": 16, "mamba_block_size": 64, "num_blocks": 256},
        "concurrency": 2,
    }
    return spec | overrides


#: Valid, but fails when it runs: the torch runner's weights file is not on the worker.
MISSING_WEIGHTS = "/nonexistent/junction-weights.safetensors"


def missing_weights_spec() -> dict[str, Any]:
    return tiny_spec(
        "missing-weights",
        runner="torch",
        modes=["off"],
        model={"weights_path": MISSING_WEIGHTS},
        workload={
            "kind": "generated_shared_prefix",
            "num_groups": 1,
            "prompts_per_group": 1,
            "system_prompt_len": 32,
            "question_len": 8,
            "output_len": 2,
        },
    )
