"""The runner interface and the order of work inside one step."""

from __future__ import annotations

from abc import ABC, abstractmethod

from engine.cache.manager import BlockCopy
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk, SchedulerOutput
from engine.tiers.moves import UnitLoad, UnitSave
from engine.tiers.unit import TierUnit


def block_rows(
    block_ids: tuple[int, ...], block_size: int, start: int, end: int
) -> list[tuple[int, int, int]]:
    """`(block id, first row, last row + 1)` of each block over `[start, end)`, in order; the
    first block holds `start` (a `UnitSave`'s blocks)."""
    rows, first = [], start // block_size
    for index, block_id in enumerate(block_ids):
        block_start = (first + index) * block_size
        low, high = max(start, block_start), min(end, block_start + block_size)
        if low < high:
            rows.append((block_id, low - block_start, high - block_start))
    return rows


class Runner(ABC):
    """Executes steps in the order docs/rules.md section 10 fixes: saves to the tiers -> zero
    new blocks -> copies -> loads from the tiers (beside the forward) -> forward."""

    medium = "CPU"
    kind = ""  # the name `make_runner` builds it by; what a disk tier's fingerprint records

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        saved = [self.save_unit(save) for save in out.saves]
        for group, block_ids in out.new_block_ids.items():
            if block_ids:
                self.zero_blocks(group, block_ids)
        for copy in out.copies:
            self.copy_block(copy)
        loading = self.start_loads(out.loads)
        try:
            result = self.forward(out.chunks)
        finally:
            self.finish_loads(loading)
        result.saved = saved
        return result

    def start_loads(self, loads: list[UnitLoad]) -> object:
        """Begin the step's loads; no chunk of the step reads what they write. Here they run
        at once; a runner with a copy thread or stream overlaps them with the forward."""
        for load in loads:
            self.load_unit(load)
        return None

    def finish_loads(self, loading: object) -> None:
        """Wait for what `start_loads` began."""
        return None

    def measure_prefill_rate(self) -> float | None:
        """Prefill tokens per second, timed on scratch blocks of an engine that holds no cache
        entries yet; None for a runner that computes nothing worth pricing a load against."""
        return None

    @abstractmethod
    def zero_blocks(self, group: str, block_ids: list[int]) -> None: ...

    @abstractmethod
    def copy_block(self, copy: BlockCopy) -> None: ...

    @abstractmethod
    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput: ...

    @abstractmethod
    def save_unit(self, save: UnitSave) -> TierUnit:
        """The unit's attention rows and state, copied out of the device blocks."""

    @abstractmethod
    def load_unit(self, load: UnitLoad) -> None:
        """Write the units' rows from `load.start` and the leaf's state into the blocks."""
