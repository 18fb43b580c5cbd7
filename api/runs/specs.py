"""Benchmark specs as the store keeps them: `bench.BenchmarkSpec` validated, then as JSON
(defaults filled in, so a stored run replays the same way whatever the defaults become)."""

from __future__ import annotations

from typing import Any


def validate_spec(obj: Any) -> dict[str, Any]:
    """`obj` as a `BenchmarkSpec`'s JSON; raises pydantic's `ValidationError` on bad input.
    Strict: each value of the JSON type `spec_schema` gives it (`false` or `"8"` is no
    integer), so a body the schema refuses is refused."""
    from bench import BenchmarkSpec  # the engine loads when a spec is first checked

    return BenchmarkSpec.model_validate(obj, strict=True).model_dump(mode="json")


def standard_suite() -> list[dict[str, Any]]:
    """The standard suite's specs, as JSON."""
    from bench import STANDARD_SUITE

    return [spec.model_dump(mode="json") for spec in STANDARD_SUITE]


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a spec as a request body (`BenchmarkSpec`'s, for validation): `name`
    and `workload` required, a workload one of its kinds. Written out whole, its `$defs` in
    place (OpenAPI keeps none of a body's own), and so without the `discriminator`s, whose
    mappings point into `$defs` (`kind`'s constant tells the workloads apart all the same)."""
    from bench import BenchmarkSpec

    schema = BenchmarkSpec.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {key: inline(value) for key, value in node.items() if key != "discriminator"}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return inline(schema)
