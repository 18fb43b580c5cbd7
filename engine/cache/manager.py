"""What the attention and Mamba managers share: request tables, step holds, invariants."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from engine.cache.block import Block, InvariantError
from engine.cache.block_pool import BlockPool


class BlockCopy(NamedTuple):
    """A whole-block copy the runner performs before the step's forward, in queue order."""

    group: str
    src: int
    dst: int
    path: str  # "consumer": shared -> private; "producer": live -> cache-owned
    request_id: str
    position: int


class GroupManager:
    """One group's request tables over its pool.

    A table maps a request's block index to a block id; Mamba tables hold `None` where no state
    was kept. Every reference a block carries is either a table slot or a hold taken for the
    current step (copy endpoints, cache-owned checkpoint blocks), released by `end_step`.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.tables: dict[str, list[int | None]] = {}
        self._holds: list[int] = []
        self._pending: list[Block] = []
        self._sources: dict[int, int] = {}  # pending block -> the block its copy reads

    @property
    def group(self) -> str:
        return self.pool.group

    def table(self, request_id: str) -> list[int | None]:
        return self.tables.setdefault(request_id, [])

    def hold(self, block_id: int) -> None:
        """Reference a block until the current step has finished."""
        self.pool.touch(block_id)
        self._holds.append(block_id)

    def keep_allocated_until_step_end(self, block: Block) -> None:
        self._holds.append(block.block_id)

    def mark_pending(self, block: Block, step: int, source: int) -> None:
        """Entries on `block` may not be hit before the copy from `source` that fills it has
        run; until the step ends, what they hold is read from `source` (`filled_from`)."""
        block.pending_step = step
        self._pending.append(block)
        self._sources[block.block_id] = source

    def filled_from(self, block_id: int) -> int:
        """The block that holds what `block_id` will once this step's copy has run: itself,
        or a pending block's copy source."""
        return self._sources.get(block_id, block_id)

    def free_request(self, request_id: str) -> None:
        """Return a request's blocks tail first, so its tail is evicted before its head."""
        table = self.tables.pop(request_id, [])
        self.pool.free(b for b in reversed(table) if b is not None)

    def end_step(self) -> None:
        holds, self._holds = self._holds, []
        self.pool.free(holds)
        for block in self._pending:
            block.pending_step = None
        self._pending.clear()
        self._sources.clear()

    def check_invariants(self) -> None:
        """Every block's reference count equals its table slots plus this step's holds."""
        self.pool.check_invariants()
        refs: Counter[int] = Counter(self._holds)
        for request_id, table in self.tables.items():
            seen: set[int] = set()
            for block_id in table:
                if block_id is None:
                    continue
                if block_id in seen:
                    raise InvariantError(
                        f"{self.group} block {block_id}: twice in request {request_id}'s table"
                    )
                seen.add(block_id)
                refs[block_id] += 1
        for block in self.pool.blocks:
            if block.ref_cnt != refs.get(block.block_id, 0):
                raise InvariantError(
                    f"{self.group} block {block.block_id}: ref_cnt {block.ref_cnt} but "
                    f"{refs.get(block.block_id, 0)} tables and holds reference it"
                )
            if block.pending_step is not None and block not in self._pending:
                raise InvariantError(f"{self.group} block {block.block_id}: stale pending mark")
