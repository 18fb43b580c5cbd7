"""What every workload is: seeded parameters in, replay trace lines out.

A workload is built from a pydantic params model (one per kind, tagged by `kind`). Its prompts
are lists of segments (`{"seed", "len"}`: `len` pseudo-random token ids drawn from `seed`), so a
trace line stays small however long the prompt, and the same params always give the same
tokens. A workload also knows the prefixes its requests share, and emits them as pin lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.traces.trace import TraceItem, parse_line

#: Upper bounds that catch a typo (a length of 10**9) before anything is generated.
MAX_LEN = 1 << 20
MAX_COUNT = 100_000

Length = Annotated[int, Field(ge=1, le=MAX_LEN)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]

Segment = dict[str, int]  # {"seed": s, "len": n}


class WorkloadParams(BaseModel):
    """Parameters every kind shares."""

    model_config = ConfigDict(extra="forbid")

    seed: Annotated[int, Field(ge=0, description="seed of every segment and of the order")] = 0
    request_rate: Annotated[
        float | None,
        Field(
            gt=0,
            description="requests per second, Poisson arrivals, for runs against a live engine "
            "(--engine); in-process replays are closed-loop at the spec's concurrency",
        ),
    ] = None

    #: geometry a spec uses when it gives none (the seed cases carry the geometry of their seed)
    suggested_settings: ClassVar[dict] = {}
    #: requests in flight a spec uses when it gives none
    suggested_concurrency: ClassVar[int] = 8

    def build(self) -> Workload:
        raise NotImplementedError

    def max_sequence_len(self) -> int:
        """The most prompt + output tokens any request of this workload holds."""
        raise NotImplementedError


@dataclass
class Workload:
    """Trace lines in replay format: requests in order, and the pins of the shared prefixes."""

    kind: str
    requests: list[dict]
    pins: list[dict] = field(default_factory=list)
    #: a chat workload's messages by request id: what a live engine is sent through
    #: `/v1/chat/completions` (the request lines hold their rendering)
    messages: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(
            len(line["prompt_token_ids"])
            if "prompt_token_ids" in line
            else segments_len(line["prompt"]["segments"])
            for line in self.requests
        )

    def lines(self, with_pins: bool = False) -> list[dict]:
        """The trace: pin lines first when asked (an operator pins before traffic)."""
        return [*self.pins, *self.requests] if with_pins else list(self.requests)

    def items(self, with_pins: bool = False) -> list[TraceItem]:
        """The trace parsed as `junction replay` parses a file: token ids, pins and all."""
        return [
            parse_line(json.dumps(line), number)
            for number, line in enumerate(self.lines(with_pins), start=1)
        ]

    def jsonl(self, with_pins: bool = False) -> str:
        lines = self.lines(with_pins)
        return "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)


class SegmentSource:
    """Fresh segment seeds from one workload seed: a new seed is a new, unshared run of tokens."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 0x6A756E63])  # "junc": apart from other draws

    def new(self, length: int) -> Segment:
        return {"seed": int(self.rng.integers(0, 2**62)), "len": length}

    def shuffled(self, values: list) -> list:
        order = self.rng.permutation(len(values))
        return [values[i] for i in order]

    def arrivals(self, count: int, rate: float) -> list[float]:
        """Poisson arrival offsets in seconds."""
        return np.cumsum(self.rng.exponential(1.0 / rate, count)).tolist()


def segments_len(segments: list[Segment]) -> int:
    return sum(s["len"] for s in segments)


def request_line(request_id: str, segments: list[Segment], max_tokens: int) -> dict:
    return {
        "id": request_id,
        "prompt": {"segments": [dict(s) for s in segments]},
        "max_tokens": max_tokens,
    }


def pin_line(pin_id: str, segments: list[Segment]) -> dict:
    return {"pin": {"segments": [dict(s) for s in segments]}, "id": pin_id}


def interleave_sessions(sessions: list[list[dict]], interleave: bool = True) -> list[dict]:
    """Round-robin across sessions (turn 0 of every session, then turn 1, ...), or each
    session whole in turn."""
    if not interleave:
        return [turn for session in sessions for turn in session]
    depth = max((len(s) for s in sessions), default=0)
    return [s[i] for i in range(depth) for s in sessions if i < len(s)]
