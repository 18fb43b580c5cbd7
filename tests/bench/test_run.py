"""`run_benchmark`: every mode against the oracle, the seeds' figures, and the ledger catching a
wrong reuse."""

from __future__ import annotations

import json

import pytest

from bench import MODES, STANDARD_SUITE, BenchmarkSpec, run_benchmark
from engine.runners.ledger import LedgerMismatch, LedgerRunner

TINY = {
    "name": "tiny",
    "workload": {
        "kind": "generated_shared_prefix",
        "num_groups": 3,
        "prompts_per_group": 5,
        "system_prompt_len": 100,
        "question_len": 40,
        "output_len": 3,
    },
    "runner": "ledger",
    "geometry": {"block_size": 16, "mamba_block_size": 64, "num_blocks": 256},
    "concurrency": 2,
}

ROW_FIELDS = {
    "mode",
    "num_requests",
    "num_prompt_tokens",
    "num_cached_tokens",
    "hit_rate",
    "oracle_hit_rate",
    "computed_tokens",
    "forward_passes",
    "cow_copies",
    "ttft_median_s",
    "ttft_p99_s",
    "throughput_tok_s",
    "peak_blocks_used",
    "wall_s",
}


@pytest.fixture(scope="module")
def tiny_results() -> tuple[dict, list]:
    calls: list[tuple[float, str]] = []
    results = run_benchmark(BenchmarkSpec.model_validate(TINY), lambda f, m: calls.append((f, m)))
    return results, calls


def test_every_mode_runs_and_reports_the_interface(tiny_results):
    results, _ = tiny_results
    json.dumps(results)  # JSON-serializable
    assert [row["mode"] for row in results["modes"]] == list(MODES)
    assert results["workload"] == {
        "kind": "generated_shared_prefix",
        "params": results["workload"]["params"],
        "num_requests": 15,
        "num_prompt_tokens": 15 * 140,
        "num_pins": 3,
    }
    assert set(results["oracle"]) == {"num_prompt_tokens", "num_oracle_tokens", "hit_rate"}
    for row in results["modes"]:
        assert ROW_FIELDS <= set(row)
        assert row["num_requests"] == 15 and row["num_prompt_tokens"] == 15 * 140
        assert set(row["peak_blocks_used"]) == {"attention", "mamba"}
        assert 0 < row["peak_blocks_used"]["attention"] <= 256
        assert 0 < row["forward_passes"] <= row["num_steps"]
        assert 0 < row["ttft_median_s"] <= row["ttft_p99_s"]
        assert row["throughput_tok_s"] > 0 and row["wall_s"] > 0
        assert row["computed_tokens"] == row["num_prompt_tokens"] - row["num_cached_tokens"]


def test_hits_never_beat_the_oracle_and_cache_off_hits_nothing(tiny_results):
    results, _ = tiny_results
    rows = {row["mode"]: row for row in results["modes"]}
    # the oracle: every group's later requests share the 100-token system prompt, floored to 16
    assert results["oracle"]["num_oracle_tokens"] == 3 * 4 * 96
    assert results["oracle_with_pins"]["num_oracle_tokens"] == 15 * 96
    for mode, row in rows.items():
        oracle = results["oracle_with_pins"] if mode == "pins" else results["oracle"]
        assert row["oracle_hit_rate"] == oracle["hit_rate"]
        assert row["num_cached_tokens"] <= oracle["num_oracle_tokens"], mode
    off = rows["off"]
    assert off["num_cached_tokens"] == 0 and off["cow_copies"] == 0
    # block-aligned hits land on lcm(16, 64) = 64 boundaries only
    assert rows["aligned"]["num_cached_tokens"] % 64 == 0
    assert rows["aligned"]["num_cached_tokens"] < rows["junction"]["num_cached_tokens"]
    assert rows["junction_inline"]["num_cached_tokens"] >= rows["junction"]["num_cached_tokens"]
    assert rows["pins"]["num_cached_tokens"] == 15 * 96  # pinned before the first request
    assert rows["pins"]["pins"] == {"num_materialized": 3, "num_failed": 0, "reasons": []}


def test_progress_rises_to_one(tiny_results):
    _, calls = tiny_results
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    for mode in MODES:  # every mode reports as its requests finish, up to the last
        counts = [m for _, m in calls if m.startswith(f"{mode}: ")]
        assert len(counts) >= 3 and counts[-1] == f"{mode}: 15/15 requests"


def run(workload: dict, modes: list[str], **spec) -> dict[str, dict]:
    obj = {"name": "seed", "workload": workload, "modes": modes, **spec}
    results = run_benchmark(BenchmarkSpec.model_validate(obj))
    return {row["mode"]: row for row in results["modes"]} | {"oracle": results["oracle"]}


def test_seed_multi_turn_hits_10000_with_partial_hits_and_9728_without():
    rows = run({"kind": "seed_multi_turn"}, ["aligned", "partial"])
    assert rows["partial"]["num_cached_tokens"] == 10000
    assert rows["aligned"]["num_cached_tokens"] == 9728
    assert rows["oracle"]["num_oracle_tokens"] == 10000


def test_seed_shared_prefix_needs_junction_checkpoints_for_560():
    rows = run({"kind": "seed_shared_prefix"}, ["partial", "junction", "pins"])
    assert rows["partial"]["num_cached_tokens"] == 0
    assert rows["junction"]["num_cached_tokens"] == 560  # the third request
    assert rows["pins"]["num_cached_tokens"] == 3 * 560
    assert rows["oracle"]["num_oracle_tokens"] == 2 * 560


def test_seed_dcp_consumer_hits_the_mamba_boundary():
    rows = run({"kind": "seed_dcp"}, ["partial"])
    assert rows["partial"]["num_cached_tokens"] == 43008
    assert rows["oracle"]["num_oracle_tokens"] == 43008


@pytest.mark.parametrize(("length", "hit"), [(7040, 6912), (7296, 7168)])
def test_seed_eagle_resend_drops_one_unit(length, hit):
    rows = run({"kind": "seed_eagle_resend", "prompt_len": length}, ["partial"])
    assert rows["partial"]["num_cached_tokens"] == hit == rows["oracle"]["num_oracle_tokens"]


def test_the_ledger_catches_a_wrong_reuse(monkeypatch):
    spec = BenchmarkSpec.model_validate(
        {"name": "broken", "workload": {"kind": "seed_shared_prefix"}, "modes": ["junction"]}
    )
    run_benchmark(spec)  # correct copies: it passes
    monkeypatch.setattr(LedgerRunner, "copy_block", lambda self, copy: None)  # copies lost
    with pytest.raises(LedgerMismatch, match="holds"):
        run_benchmark(spec)


def test_the_standard_suite_is_valid_and_named_apart():
    names = [spec.name for spec in STANDARD_SUITE]
    assert len(names) == len(set(names)) >= 8
    assert {spec.workload.kind for spec in STANDARD_SUITE} >= {
        "generated_shared_prefix",
        "multi_turn",
        "prefix_repetition",
        "agentic",
        "seed_multi_turn",
        "seed_shared_prefix",
        "seed_dcp",
        "seed_eagle_resend",
    }
    assert all(spec.runner == "ledger" and spec.modes == list(MODES) for spec in STANDARD_SUITE)


def test_the_pinned_oracle_is_reported_without_the_pins_mode():
    results = run_benchmark(BenchmarkSpec.model_validate({**TINY, "modes": ["off"]}))
    assert results["oracle"]["num_oracle_tokens"] == 3 * 4 * 96
    assert results["oracle_with_pins"]["num_oracle_tokens"] == 15 * 96
