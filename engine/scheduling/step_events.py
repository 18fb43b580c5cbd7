"""The events a scheduler step emits about blocks: each copy-on-write copy as it is queued
(`BlockCopied`, and the request's `cow_copies`), and the rows of the blocks the step changed
(`BlockStateChanged`)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.cache.block_pool import BlockPool
from engine.cache.manager import BlockCopy
from engine.events import BlockCopied, BlockStateChanged, EventSink
from engine.request import CowCopy, Request
from engine.scheduling.outputs import SchedulerOutput


@dataclass
class StepEvents:
    sink: EventSink
    pools: dict[str, BlockPool]

    def queue_copies(self, out: SchedulerOutput, request: Request, copies: list[BlockCopy]) -> None:
        """Queue the copies in the step's output, record them on the request, emit them."""
        is_recording = self.sink.is_recording
        for copy in copies:
            out.copies.append(copy)
            request.cow_copies.append(
                CowCopy(copy.group, copy.path, copy.src, copy.dst, copy.position, out.step)
            )
            if not is_recording:
                continue
            self.sink.emit(
                BlockCopied(
                    group_idx=self.pools[copy.group].group_idx,
                    group=copy.group,
                    src_block_id=copy.src,
                    dst_block_id=copy.dst,
                    path=copy.path,
                    request_id=copy.request_id,
                    position=copy.position,
                    step=out.step,
                )
            )

    def block_states(self, step: int) -> None:
        """Emit the rows of every block changed since the last call, a group at a time."""
        if not self.sink.is_recording:
            return
        for pool in self.pools.values():
            dirty = pool.take_dirty()
            if dirty:
                self.sink.emit(
                    BlockStateChanged(
                        group_idx=pool.group_idx,
                        group=pool.group,
                        blocks=[pool.row(b) for b in dirty],
                        step=step,
                    )
                )
