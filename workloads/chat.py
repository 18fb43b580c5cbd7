"""Chat-structured workloads: `chat_shared_prefix`, `chat_multi_turn` and `chat_agentic`.

The same shapes as `generated_shared_prefix`, `multi_turn` and `agentic`, but as role messages
with text content (no pins): a system message, then user, assistant and tool turns. Each
segment becomes seeded ASCII text of `len` characters (one byte token each). A request line
holds the messages rendered by the engine's chat template (`render_chat` and the byte
tokenizer) as `prompt_token_ids`, with `checkpoint_offsets` where each message ends, as a chat
request to the engine's server carries them; `Workload.messages` keeps the messages for runs
against a live engine, which are sent through `/v1/chat/completions`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from engine.model.tokenizer import ASSISTANT_HEADER, ByteTokenizer, message_ends, render_chat
from workloads.agentic import Agentic
from workloads.base import Segment, SegmentSource, Workload, interleave_sessions
from workloads.multi_turn import MultiTurn
from workloads.shared_prefix import GeneratedSharedPrefix

Message = dict[str, str]
ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      .,", dtype=np.uint8)


def segment_text(segment: Segment) -> str:
    """`len` characters of seeded ASCII text: the same segment always gives the same text."""
    rng = np.random.default_rng([segment["seed"], 0x74657874])  # "text"
    return ALPHABET[rng.integers(0, len(ALPHABET), segment["len"])].tobytes().decode("ascii")


def message(role: str, segment: Segment) -> Message:
    return {"role": role, "content": segment_text(segment)}


def chat_request_line(request_id: str, messages: list[Message], max_tokens: int) -> dict:
    """A trace line of the rendered chat: token ids, and where each message ends."""
    return {
        "id": request_id,
        "prompt_token_ids": ByteTokenizer().encode(render_chat(messages)),
        "checkpoint_offsets": message_ends(messages),
        "max_tokens": max_tokens,
    }


def chat_workload(kind: str, conversations: list[tuple[str, list[Message], int]]) -> Workload:
    """A workload of `(request id, messages, max_tokens)` in order, without pins."""
    return Workload(
        kind,
        [chat_request_line(*conversation) for conversation in conversations],
        messages={request_id: messages for request_id, messages, _ in conversations},
    )


def template_len(*roles: str) -> int:
    """The tokens the chat template adds to messages of these roles (`<|role|>\n`, a newline
    after each), and the assistant's open header after them."""
    return sum(len(f"<|{role}|>\n\n") for role in roles) + len(ASSISTANT_HEADER)


class ChatSharedPrefix(GeneratedSharedPrefix):
    """`num_groups` system messages, each followed by `prompts_per_group` user questions."""

    kind: Literal["chat_shared_prefix"] = "chat_shared_prefix"  # type: ignore[assignment]

    def max_sequence_len(self) -> int:
        return super().max_sequence_len() + template_len("system", "user")

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        systems = [source.new(self.system_prompt_len) for _ in range(self.num_groups)]
        conversations = [
            (
                f"g{g}-q{q}",
                [message("system", system), message("user", source.new(self.question_len))],
                self.output_len,
            )
            for g, system in enumerate(systems)
            for q in range(self.prompts_per_group)
        ]
        if self.shuffle:
            conversations = source.shuffled(conversations)
        return chat_workload(self.kind, conversations)


class ChatMultiTurn(MultiTurn):
    """A shared system message, a user's history message, then per round a user question and
    (modelled, as in `multi_turn`) the assistant's answer."""

    kind: Literal["chat_multi_turn"] = "chat_multi_turn"  # type: ignore[assignment]

    def max_sequence_len(self) -> int:
        rounds = ["user"] * self.num_rounds + ["assistant"] * (self.num_rounds - 1)
        return super().max_sequence_len() + template_len("system", "user", *rounds)

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        system = message("system", source.new(self.system_prompt_len))
        sessions: list[list[tuple[str, list[Message], int]]] = []
        for user in range(self.num_users):
            context = [system, message("user", source.new(self.user_history_len))]
            turns = []
            for round_ in range(self.num_rounds):
                context = [*context, message("user", source.new(self.question_len))]
                turns.append((f"u{user}-r{round_}", context, self.answer_len))
                context = [*context, message("assistant", source.new(self.answer_len))]
            sessions.append(turns)
        return chat_workload(self.kind, interleave_sessions(sessions, self.interleave))


class ChatAgentic(Agentic):
    """A shared system message and a user task, then per step the assistant's action (its
    tool call) and the tool's output."""

    kind: Literal["chat_agentic"] = "chat_agentic"  # type: ignore[assignment]

    def max_sequence_len(self) -> int:
        steps = ["assistant", "tool"] * (self.num_steps - 1)
        return super().max_sequence_len() + template_len("system", "user", *steps)

    def build(self) -> Workload:
        source = SegmentSource(self.seed)
        system = message("system", source.new(self.system_prompt_len))
        sessions: list[list[tuple[str, list[Message], int]]] = []
        for session in range(self.num_sessions):
            context = [system, message("user", source.new(self.task_len))]
            steps = []
            for step in range(self.num_steps):
                if step:
                    context = [
                        *context,
                        message("assistant", source.new(self.action_len)),
                        message("tool", source.new(self.tool_output_len)),
                    ]
                steps.append((f"a{session}-s{step}", context, self.action_len))
            sessions.append(steps)
        return chat_workload(self.kind, interleave_sessions(sessions))
