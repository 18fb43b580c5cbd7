"""Benchmark runs: a workload, the engine's settings, a runner and a list of modes.

from bench import BenchmarkSpec, run_benchmark, STANDARD_SUITE, MODES
spec = BenchmarkSpec.model_validate(obj)   # bad input: pydantic ValidationError
results = run_benchmark(spec, progress=None)  # progress(fraction 0..1, message)

The names load with their module on first use (PEP 562), not with the package: `junction`
imports `bench.cli` for its parser on every command, and the engine and the workloads that
`bench.run` and `bench.spec` bring are no part of `junction route`'s start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

if TYPE_CHECKING:
    from bench.run import BenchmarkError, run_benchmark
    from bench.spec import MODES, BenchmarkSpec, EngineSettings, ModelOptions
    from bench.suite import STANDARD_SUITE

#: each public name, and the module that defines it
_HOMES = {
    "BenchmarkError": "bench.run",
    "run_benchmark": "bench.run",
    "MODES": "bench.spec",
    "BenchmarkSpec": "bench.spec",
    "EngineSettings": "bench.spec",
    "ModelOptions": "bench.spec",
    "STANDARD_SUITE": "bench.suite",
}

__all__ = [
    "MODES",
    "STANDARD_SUITE",
    "BenchmarkError",
    "BenchmarkSpec",
    "EngineSettings",
    "ModelOptions",
    "run_benchmark",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
