"""Benchmark runs: a workload, the engine's settings, a runner and a list of modes.

from bench import BenchmarkSpec, run_benchmark, STANDARD_SUITE, MODES
spec = BenchmarkSpec.model_validate(obj)   # bad input: pydantic ValidationError
results = run_benchmark(spec, progress=None)  # progress(fraction 0..1, message)
"""

from __future__ import annotations

from bench.run import BenchmarkError, run_benchmark
from bench.spec import MODES, BenchmarkSpec, EngineSettings, ModelOptions
from bench.suite import STANDARD_SUITE

__all__ = [
    "MODES",
    "STANDARD_SUITE",
    "BenchmarkError",
    "BenchmarkSpec",
    "EngineSettings",
    "ModelOptions",
    "run_benchmark",
]
