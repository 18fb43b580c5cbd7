"""The runner interface and the order of work inside one step."""

from __future__ import annotations

from abc import ABC, abstractmethod

from engine.cache.manager import BlockCopy
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk, SchedulerOutput


class Runner(ABC):
    """Executes steps in the order docs/rules.md section 10 fixes: zero new blocks -> copies ->
    forward."""

    medium = "CPU"

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        for group, block_ids in out.new_block_ids.items():
            if block_ids:
                self.zero_blocks(group, block_ids)
        for copy in out.copies:
            self.copy_block(copy)
        return self.forward(out.chunks)

    @abstractmethod
    def zero_blocks(self, group: str, block_ids: list[int]) -> None: ...

    @abstractmethod
    def copy_block(self, copy: BlockCopy) -> None: ...

    @abstractmethod
    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput: ...
