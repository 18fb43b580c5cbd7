"""What the scheduler hands the runner for one step, and what the runner hands back."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.cache.manager import BlockCopy
from engine.request import SamplingParams
from engine.tiers.moves import UnitLoad, UnitSave
from engine.tiers.unit import TierUnit


@dataclass
class ScheduledChunk:
    """One request's work in a step: compute tokens `[start, end)` of `token_ids`.

    The runner reads KV for `[0, start)` and writes `[start, end)` through
    `attention_block_ids`; it reads the Mamba state at `start` from `mamba_read_block` (`None`:
    zero state) and writes the state at each `(position, block)` of `mamba_writes`.
    """

    request_id: str
    token_ids: list[int]
    start: int
    end: int
    attention_block_ids: list[int]
    mamba_read_block: int | None
    mamba_writes: list[tuple[int, int]]
    sample: bool
    sampling: SamplingParams
    output_index: int  # how many tokens the request has produced before this step


@dataclass
class SchedulerOutput:
    step: int
    chunks: list[ScheduledChunk] = field(default_factory=list)
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)
    copies: list[BlockCopy] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    saves: list[UnitSave] = field(default_factory=list)  # copied out first (`engine.tiers`)
    loads: list[UnitLoad] = field(default_factory=list)  # written in after the copies

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(c.end - c.start for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.copies and not self.saves and not self.loads


@dataclass
class RunnerOutput:
    """Sampled tokens of the chunks that reached their request's end; optional logits."""

    sampled: dict[str, int] = field(default_factory=dict)
    logits: dict[str, object] = field(default_factory=dict)
    saved: list[TierUnit] = field(default_factory=list)  # the step's saves, in their order
