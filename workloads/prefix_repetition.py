"""`prefix_repetition`: vLLM's prefix-repetition benchmark.

`num_prefixes` prefixes of `prefix_len` tokens; `num_prompts` requests, each one prefix (in
turn) and a suffix of its own of `suffix_len` tokens, shuffled. vLLM's defaults: 10 prefixes
of 256 tokens, 256-token suffixes, 128 output tokens.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from workloads.base import (
    Count,
    Length,
    SegmentSource,
    Workload,
    WorkloadParams,
    pin_line,
    request_line,
)


class PrefixRepetition(WorkloadParams):
    kind: Literal["prefix_repetition"] = "prefix_repetition"
    num_prefixes: Count = 10
    prefix_len: Length = 256
    suffix_len: Length = 256
    num_prompts: Count = 1000
    output_len: Length = 128

    @model_validator(mode="after")
    def _enough_prompts(self) -> PrefixRepetition:
        if self.num_prompts < self.num_prefixes:
            raise ValueError(
                f"num_prompts ({self.num_prompts}) must be at least num_prefixes "
                f"({self.num_prefixes}): every prefix is used"
            )
        return self

    def max_sequence_len(self) -> int:
        return self.prefix_len + self.suffix_len + self.output_len

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        prefixes = [source.new(self.prefix_len) for _ in range(self.num_prefixes)]
        requests = [
            request_line(
                f"p{i % self.num_prefixes}-{i}",
                [prefixes[i % self.num_prefixes], source.new(self.suffix_len)],
                self.output_len,
            )
            for i in range(self.num_prompts)
        ]
        pins = [pin_line(f"prefix-{i}", [prefix]) for i, prefix in enumerate(prefixes)]
        return Workload(self.kind, source.shuffled(requests), pins)
