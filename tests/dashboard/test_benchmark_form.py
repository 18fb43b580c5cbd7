"""The Benchmarks form's quick preset, run as a worker runs it: it must stay well under a
minute on the ledger runner (issue 33: the old default took 12 minutes and held the worker)."""

from __future__ import annotations

import time

from bench import run_benchmark
from dashboard.forms.benchmark import QUICK, QUICK_SIZE, estimate
from workloads import build_workload


def test_the_quick_preset_runs_in_seconds() -> None:
    started = time.perf_counter()
    results = run_benchmark(QUICK)
    elapsed = time.perf_counter() - started
    assert [m["mode"] for m in results["modes"]] == QUICK["modes"]
    assert elapsed < 30, f"the quick preset took {elapsed:.1f} s"


def test_the_estimate_counts_the_workloads_requests_and_the_modes() -> None:
    workload = build_workload(QUICK["workload"])
    assert QUICK_SIZE == (64, workload.num_prompt_tokens, 6)
    assert QUICK_SIZE.num_replays == 384
    size = estimate({"kind": "multi_turn", "num_users": 2, "num_rounds": 3}, ["off"])
    assert (size.num_requests, size.num_modes) == (6, 1)
