"""`junction bench` carries the bound under memory beside the oracle, and the table shows each
mode's hits as a share of it; results stored before the bound still print."""

from __future__ import annotations

from rich.console import Console

from bench import BenchmarkSpec, run_benchmark
from bench.table import results_table

SQUEEZED = {
    "name": "squeezed",
    "workload": {
        "kind": "generated_shared_prefix",
        "num_groups": 6,
        "prompts_per_group": 4,
        "system_prompt_len": 160,
        "question_len": 32,
        "output_len": 2,
    },
    "geometry": {"block_size": 16, "mamba_block_size": 64, "num_blocks": 40},
    "modes": ["off", "junction_inline"],
    "concurrency": 1,
}


def render(results: dict) -> str:
    console = Console(width=250, record=True)
    console.print(results_table(results))
    return console.export_text()


def test_the_bound_sits_between_the_engine_and_the_oracle_in_a_small_pool():
    results = run_benchmark(BenchmarkSpec.model_validate(SQUEEZED))
    bound, oracle = results["bound"], results["oracle"]
    assert (bound["num_blocks"], bound["concurrency"]) == (40, 1)
    # 40 blocks hold about three of the six 12-block system prompts: the bound is below the
    # oracle but keeps some
    assert 0 < bound["hit_rate"] < oracle["hit_rate"]
    rows = {row["mode"]: row for row in results["modes"]}
    assert rows["off"]["bound_hit_rate"] == bound["hit_rate"]
    assert rows["off"]["hit_rate"] == 0
    assert "% of bound" in render(results)


def test_results_without_the_bound_still_print():
    results = run_benchmark(BenchmarkSpec.model_validate({**SQUEEZED, "modes": ["off"]}))
    del results["bound"]
    for row in results["modes"]:
        del row["bound_hit_rate"]
    assert "off" in render(results)
