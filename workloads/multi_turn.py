"""`multi_turn`: LMCache's multi-round QA.

`num_users` users share one system prompt; each has a history of its own, then `num_rounds`
turns. Turn `r`'s prompt is turn `r - 1`'s prompt, its answer and a new question. A trace
cannot know the engine's answers in advance, so each answer is modelled as a seeded segment of
`answer_len` tokens (what the client sends back as the assistant turn); the engine's own output
tokens differ, so what a later turn can share is exactly the earlier turn's prompt, and that is
what the oracle counts. Turns are interleaved across users (round-robin), as concurrent users
send them.
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


class MultiTurn(WorkloadParams):
    kind: Literal["multi_turn"] = "multi_turn"
    num_users: Count = 10
    num_rounds: Count = 5
    system_prompt_len: Length = 1000
    user_history_len: Length = 2000
    question_len: Length = 64
    answer_len: Length = 100
    interleave: bool = True

    def max_sequence_len(self) -> int:
        return (
            self.system_prompt_len
            + self.user_history_len
            + self.num_rounds * (self.question_len + self.answer_len)
        )

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        system = source.new(self.system_prompt_len)
        sessions: list[list[dict]] = []
        for user in range(self.num_users):
            context = [system, source.new(self.user_history_len)]
            turns = []
            for round_ in range(self.num_rounds):
                context = [*context, source.new(self.question_len)]
                turns.append(request_line(f"u{user}-r{round_}", context, self.answer_len))
                context = [*context, source.new(self.answer_len)]  # the modelled answer
            sessions.append(turns)
        requests = interleave_sessions(sessions, self.interleave)
        return Workload(self.kind, requests, [pin_line("system", [system])])
