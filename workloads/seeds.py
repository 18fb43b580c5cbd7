"""The cases of the design seeds, each with the geometry it was reported on.

- `seed_multi_turn`: 10000 tokens, then the same 10000 plus 200 (Ba 16, Bm 512, U 16): the
  second request hits 10000 with partial hits (the extension checkpoint), 9728 without.
- `seed_shared_prefix`: three 1946-token requests sharing a 560-token system prompt: with
  junction checkpoints the third hits 560; without, the Mamba state at 560 never exists.
- `seed_dcp`: a 44449-token producer, then a 44609-token consumer that extends it, under DCP 8
  with 1536-token blocks (attention blocks of 12288): the consumer hits 43008, the Mamba
  boundary, not the 36864 of the DCP-expanded attention block.
- `seed_eagle_resend`: a prompt sent twice with EAGLE (U 128, blocks 896): the resend hits one
  unit below the prompt's unit floor (7040 -> 6912, 7296 -> 7168).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAMBA_BLOCK_SIZE
from workloads.base import (
    Length,
    SegmentSource,
    Workload,
    WorkloadParams,
    pin_line,
    request_line,
)

#: the default blocks (Ba 16, Bm 512) with a match unit of 16
_FINE_16 = {
    "block_size": DEFAULT_BLOCK_SIZE,
    "mamba_block_size": DEFAULT_MAMBA_BLOCK_SIZE,
    "prefix_match_unit": 16,
}


class SeedMultiTurn(WorkloadParams):
    kind: Literal["seed_multi_turn"] = "seed_multi_turn"
    first_len: Length = 10000
    extension_len: Length = 200
    output_len: Length = 1

    suggested_settings: ClassVar[dict] = _FINE_16
    suggested_concurrency: ClassVar[int] = 1

    def max_sequence_len(self) -> int:
        return self.first_len + self.extension_len + self.output_len

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        first = source.new(self.first_len)
        requests = [
            request_line("turn-1", [first], self.output_len),
            request_line("turn-2", [first, source.new(self.extension_len)], self.output_len),
        ]
        return Workload(self.kind, requests, [pin_line("turn-1", [first])])


class SeedSharedPrefix(WorkloadParams):
    kind: Literal["seed_shared_prefix"] = "seed_shared_prefix"
    num_requests: Annotated[int, Field(ge=1, le=10_000)] = 3
    prompt_len: Length = 1946
    shared_len: Length = 560
    output_len: Length = 1

    suggested_settings: ClassVar[dict] = _FINE_16
    suggested_concurrency: ClassVar[int] = 1

    @model_validator(mode="after")
    def _shared_inside(self) -> SeedSharedPrefix:
        if self.shared_len >= self.prompt_len:
            raise ValueError(
                f"shared_len ({self.shared_len}) must be less than prompt_len "
                f"({self.prompt_len}): each request has tokens of its own"
            )
        return self

    def max_sequence_len(self) -> int:
        return self.prompt_len + self.output_len

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        shared = source.new(self.shared_len)
        requests = [
            request_line(
                f"r{i}", [shared, source.new(self.prompt_len - self.shared_len)], self.output_len
            )
            for i in range(self.num_requests)
        ]
        return Workload(self.kind, requests, [pin_line("system", [shared])])


class SeedDcp(WorkloadParams):
    kind: Literal["seed_dcp"] = "seed_dcp"
    producer_len: Length = 44449
    consumer_len: Length = 44609
    output_len: Length = 1

    suggested_settings: ClassVar[dict] = {
        "block_size": 1536,
        "mamba_block_size": 1536,
        "dcp_size": 8,
        "num_blocks": 64,
        "num_mamba_blocks": 128,
        "max_num_batched_tokens": 16384,
    }
    suggested_concurrency: ClassVar[int] = 1

    @model_validator(mode="after")
    def _consumer_extends(self) -> SeedDcp:
        if self.consumer_len <= self.producer_len:
            raise ValueError(
                f"consumer_len ({self.consumer_len}) must exceed producer_len "
                f"({self.producer_len}): the consumer extends the producer's prompt"
            )
        return self

    def max_sequence_len(self) -> int:
        return self.consumer_len + self.output_len

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        producer = source.new(self.producer_len)
        extension = source.new(self.consumer_len - self.producer_len)
        requests = [
            request_line("producer", [producer], self.output_len),
            request_line("consumer", [producer, extension], self.output_len),
        ]
        return Workload(self.kind, requests, [pin_line("producer", [producer])])


class SeedEagleResend(WorkloadParams):
    kind: Literal["seed_eagle_resend"] = "seed_eagle_resend"
    prompt_len: Length = 7040
    num_sends: Annotated[int, Field(ge=2, le=1000)] = 2
    output_len: Length = 1

    suggested_settings: ClassVar[dict] = {
        "block_size": 896,
        "mamba_block_size": 896,
        "prefix_match_unit": 128,
        "eagle": True,
        "num_blocks": 256,
    }
    suggested_concurrency: ClassVar[int] = 1

    def max_sequence_len(self) -> int:
        return self.prompt_len + self.output_len

    def build(self) -> Workload:
        prompt = SegmentSource(self.seed).new(self.prompt_len)
        requests = [
            request_line(f"send-{i + 1}", [prompt], self.output_len) for i in range(self.num_sends)
        ]
        return Workload(self.kind, requests, [pin_line("prompt", [prompt])])
