"""The nightly suite: small enough for a few minutes on a 2-core CPU with the ledger runner.

Each workload kind at a reduced scale (the chat kinds smaller still), and every seed case on
the geometry of its seed.
"""

from __future__ import annotations

from bench.spec import BenchmarkSpec
from engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAMBA_BLOCK_SIZE

_FINE = {
    "block_size": DEFAULT_BLOCK_SIZE,
    "mamba_block_size": DEFAULT_MAMBA_BLOCK_SIZE,
    "num_blocks": 8192,
}

STANDARD_SUITE: list[BenchmarkSpec] = [
    BenchmarkSpec.model_validate(spec)
    for spec in (
        {
            "name": "gsp-nightly",
            "workload": {
                "kind": "generated_shared_prefix",
                "num_groups": 8,
                "prompts_per_group": 16,
                "system_prompt_len": 2048,
                "question_len": 128,
                "output_len": 32,
            },
            "geometry": _FINE,
            "concurrency": 8,
        },
        {
            "name": "gsp-unaligned-nightly",
            "workload": {
                "kind": "generated_shared_prefix",
                "num_groups": 4,
                "prompts_per_group": 16,
                "system_prompt_len": 1000,
                "question_len": 200,
                "output_len": 16,
            },
            "geometry": _FINE,
            "concurrency": 4,
        },
        {
            "name": "multi-turn-nightly",
            "workload": {"kind": "multi_turn", "num_users": 8, "num_rounds": 4, "answer_len": 32},
            "geometry": _FINE,
            "concurrency": 4,
        },
        {
            "name": "prefix-repetition-nightly",
            "workload": {"kind": "prefix_repetition", "num_prompts": 200, "output_len": 16},
            "geometry": _FINE,
            "concurrency": 8,
        },
        {
            "name": "agentic-nightly",
            "workload": {"kind": "agentic", "num_sessions": 4, "num_steps": 6},
            "geometry": _FINE,
            "concurrency": 4,
        },
        {
            "name": "chat-gsp-nightly",
            "workload": {
                "kind": "chat_shared_prefix",
                "num_groups": 4,
                "prompts_per_group": 8,
                "system_prompt_len": 1000,
                "question_len": 128,
                "output_len": 16,
            },
            "geometry": _FINE,
            "concurrency": 4,
        },
        {
            "name": "chat-multi-turn-nightly",
            "workload": {
                "kind": "chat_multi_turn",
                "num_users": 4,
                "num_rounds": 4,
                "answer_len": 32,
            },
            "geometry": _FINE,
            "concurrency": 4,
        },
        {
            "name": "chat-agentic-nightly",
            "workload": {"kind": "chat_agentic", "num_sessions": 4, "num_steps": 4},
            "geometry": _FINE,
            "concurrency": 4,
        },
        {"name": "seed-multi-turn", "workload": {"kind": "seed_multi_turn"}},
        {"name": "seed-shared-prefix", "workload": {"kind": "seed_shared_prefix"}},
        {"name": "seed-dcp", "workload": {"kind": "seed_dcp"}},
        {"name": "seed-eagle-7040", "workload": {"kind": "seed_eagle_resend", "prompt_len": 7040}},
        {"name": "seed-eagle-7296", "workload": {"kind": "seed_eagle_resend", "prompt_len": 7296}},
    )
]
