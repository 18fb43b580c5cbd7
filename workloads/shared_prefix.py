"""`generated_shared_prefix`: SGLang's generated-shared-prefix benchmark.

`num_groups` system prompts, each followed by `prompts_per_group` questions of their own; the
requests are shuffled (as SGLang does), so a group's requests arrive spread over the run.
SGLang's defaults: 64 groups of 16 prompts, a 2048-token system prompt, 128-token questions,
256 output tokens.
"""

from __future__ import annotations

from typing import Literal

from workloads.base import (
    Count,
    Length,
    SegmentSource,
    Workload,
    WorkloadParams,
    pin_line,
    request_line,
)


class GeneratedSharedPrefix(WorkloadParams):
    kind: Literal["generated_shared_prefix"] = "generated_shared_prefix"
    num_groups: Count = 64
    prompts_per_group: Count = 16
    system_prompt_len: Length = 2048
    question_len: Length = 128
    output_len: Length = 256
    shuffle: bool = True

    def max_sequence_len(self) -> int:
        return self.system_prompt_len + self.question_len + self.output_len

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        systems = [source.new(self.system_prompt_len) for _ in range(self.num_groups)]
        requests = [
            request_line(f"g{g}-q{q}", [system, source.new(self.question_len)], self.output_len)
            for g, system in enumerate(systems)
            for q in range(self.prompts_per_group)
        ]
        if self.shuffle:
            requests = source.shuffled(requests)
        pins = [pin_line(f"system-{g}", [system]) for g, system in enumerate(systems)]
        return Workload(self.kind, requests, pins)
