"""Benchmark runs: a workload, the engine's settings, a runner and a list of modes.

from engine.bench import BenchmarkSpec, run_benchmark, STANDARD_SUITE, MODES
spec = BenchmarkSpec.model_validate(obj)   # bad input: pydantic ValidationError
results = run_benchmark(spec, progress=None)  # progress(fraction 0..1, message)
"""

from __future__ import annotations

from engine.bench.run import BenchmarkError, run_benchmark
from engine.bench.spec import MODES, BenchmarkSpec, EngineSettings, ModelOptions
from engine.bench.suite import STANDARD_SUITE

__all__ = [
    "MODES",
    "STANDARD_SUITE",
    "BenchmarkError",
    "BenchmarkSpec",
    "EngineSettings",
    "ModelOptions",
    "run_benchmark",
]
