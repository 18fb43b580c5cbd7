"""Benchmark specs as the store keeps them: `engine.bench.BenchmarkSpec` validated, then as JSON
(defaults filled in, so a stored run replays the same way whatever the defaults become)."""

from __future__ import annotations

from typing import Any


def validate_spec(obj: Any) -> dict[str, Any]:
    """`obj` as a `BenchmarkSpec`'s JSON; raises pydantic's `ValidationError` on bad input."""
    from engine.bench import BenchmarkSpec  # the engine loads when a spec is first checked

    return BenchmarkSpec.model_validate(obj).model_dump(mode="json")


def standard_suite() -> list[dict[str, Any]]:
    """The standard suite's specs, as JSON."""
    from engine.bench import STANDARD_SUITE

    return [spec.model_dump(mode="json") for spec in STANDARD_SUITE]
