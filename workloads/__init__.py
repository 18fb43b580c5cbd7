"""Seeded, reproducible workloads in the replay trace format, and the oracle.

from workloads import WorkloadSpec, build_workload, oracle
workload = build_workload({"kind": "generated_shared_prefix", "num_groups": 4})
workload.jsonl(with_pins=True)  # a trace `junction replay` reads
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter

from workloads.agentic import Agentic
from workloads.base import Workload, WorkloadParams
from workloads.chat import ChatAgentic, ChatMultiTurn, ChatSharedPrefix
from workloads.multi_turn import MultiTurn
from workloads.oracle import OracleHit, OracleResult, capped_hit, oracle
from workloads.prefix_repetition import PrefixRepetition
from workloads.seeds import SeedDcp, SeedEagleResend, SeedMultiTurn, SeedSharedPrefix
from workloads.shared_prefix import GeneratedSharedPrefix

WORKLOAD_KINDS: dict[str, type[WorkloadParams]] = {
    cls.model_fields["kind"].default: cls
    for cls in (
        GeneratedSharedPrefix,
        MultiTurn,
        PrefixRepetition,
        Agentic,
        ChatSharedPrefix,
        ChatMultiTurn,
        ChatAgentic,
        SeedMultiTurn,
        SeedSharedPrefix,
        SeedDcp,
        SeedEagleResend,
    )
}

WorkloadSpec = Annotated[
    GeneratedSharedPrefix
    | MultiTurn
    | PrefixRepetition
    | Agentic
    | ChatSharedPrefix
    | ChatMultiTurn
    | ChatAgentic
    | SeedMultiTurn
    | SeedSharedPrefix
    | SeedDcp
    | SeedEagleResend,
    Field(discriminator="kind"),
]

_ADAPTER: TypeAdapter[WorkloadParams] = TypeAdapter(WorkloadSpec)


def parse_workload(obj: dict | WorkloadParams) -> WorkloadParams:
    """Validate a workload's params (a dict with `kind`); raises pydantic's `ValidationError`."""
    if isinstance(obj, WorkloadParams):
        return obj
    return _ADAPTER.validate_python(obj)


def build_workload(obj: dict | WorkloadParams) -> Workload:
    return parse_workload(obj).build()


__all__ = [
    "WORKLOAD_KINDS",
    "Agentic",
    "ChatAgentic",
    "ChatMultiTurn",
    "ChatSharedPrefix",
    "GeneratedSharedPrefix",
    "MultiTurn",
    "OracleHit",
    "OracleResult",
    "PrefixRepetition",
    "SeedDcp",
    "SeedEagleResend",
    "SeedMultiTurn",
    "SeedSharedPrefix",
    "Workload",
    "WorkloadParams",
    "WorkloadSpec",
    "build_workload",
    "capped_hit",
    "oracle",
    "parse_workload",
]
