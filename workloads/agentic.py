"""`agentic`: agents whose context grows by a tool call and its output at every step.

`num_sessions` agents share a system prompt (instructions and tool definitions); each starts
from a task of its own. Step `s`'s prompt is step `s - 1`'s prompt, the agent's action (its
tool call: the previous step's output, modelled as a seeded segment of `action_len` tokens as
in `multi_turn`) and the tool's output. Steps are interleaved across sessions.
"""

from __future__ import annotations

from typing import Literal

from workloads.base import (
    Count,
    Length,
    SegmentSource,
    Workload,
    WorkloadParams,
    interleave_sessions,
    pin_line,
    request_line,
)


class Agentic(WorkloadParams):
    kind: Literal["agentic"] = "agentic"
    num_sessions: Count = 4
    num_steps: Count = 8
    system_prompt_len: Length = 2000
    task_len: Length = 200
    tool_output_len: Length = 500
    action_len: Length = 50

    def max_sequence_len(self) -> int:
        return (
            self.system_prompt_len
            + self.task_len
            + (self.num_steps - 1) * (self.action_len + self.tool_output_len)
            + self.action_len  # the last step's output
        )

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        system = source.new(self.system_prompt_len)
        sessions: list[list[dict]] = []
        for session in range(self.num_sessions):
            context = [system, source.new(self.task_len)]
            steps = []
            for step in range(self.num_steps):
                if step:
                    context = [
                        *context,
                        source.new(self.action_len),
                        source.new(self.tool_output_len),
                    ]
                steps.append(request_line(f"a{session}-s{step}", context, self.action_len))
            sessions.append(steps)
        return Workload(self.kind, interleave_sessions(sessions), [pin_line("system", [system])])
