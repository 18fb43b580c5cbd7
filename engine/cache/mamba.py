"""The Mamba group: one recurrent state (conv + SSM, every Mamba layer) per block.

Aligned tables: slot `i` of a request holds the state after `(i + 1) * Bm` tokens, or the live
state while the request's computed count lies in `(i * Bm, (i + 1) * Bm]`; `None` where no state
was kept. A checkpoint `H_p` points at a block holding the state at exactly `p`. A live block
is rewritten by its owner's next step, so before that write its keys move to a cache-owned
block and a copy `live -> cache-owned` runs ahead of the forward (producer copy-on-write).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import Enum
from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.cache.entry import RETENTION, TAIL_REASONS, CheckpointReason
from engine.cache.manager import BlockCopy, GroupManager
from engine.hashing import BlockHash

INTERVAL_RETENTION = RETENTION[CheckpointReason.INTERVAL]


class MambaHit(NamedTuple):
    length: int
    block_id: int | None
    is_pending: bool


class WriteKind(Enum):
    NEW_SLOT = "new_slot"  # the table slot is empty: allocate it
    REUSE_SLOT = "reuse_slot"  # the slot is the request's own block, no keys on it
    MOVE_SLOT = "move_slot"  # the slot holds keys: move them out, copy, then overwrite
    OWNED = "owned"  # a checkpoint inside a slot's span (inline): a cache-owned block


class MambaWrites(NamedTuple):
    read_block: int | None
    writes: list[tuple[int, int]]  # (position, block id), ascending
    copies: list[BlockCopy]
    new_block_ids: list[int]


class MambaManager(GroupManager):
    def slot_index(self, position: int) -> int:
        return (position - 1) // self.block_size

    # ------------------------------------------------------------------ admission
    def count_admission(self, hit: MambaHit) -> int:
        if hit.block_id is None:
            return 0
        touched = 1 if self.pool.is_free(hit.block_id) else 0
        return touched + (1 if hit.length % self.block_size else 0)

    def admit(self, request_id: str, hit: MambaHit) -> list[BlockCopy]:
        """Point the request's slot for the hit at the checkpoint, or at a private copy of it
        when the request will keep writing that slot (hit inside the block)."""
        table = self.table(request_id)
        if hit.block_id is None:
            return []
        table.extend([None] * self.slot_index(hit.length))
        if hit.length % self.block_size == 0:
            self.pool.touch(hit.block_id)
            table.append(hit.block_id)
            return []
        self.hold(hit.block_id)
        (private,) = self.pool.allocate(1)
        private.token_start = len(table) * self.block_size
        table.append(private.block_id)
        self.hold(private.block_id)
        return [
            BlockCopy(
                self.group, hit.block_id, private.block_id, "consumer", request_id, hit.length
            )
        ]

    def virtual_admission_table(self, hit: MambaHit) -> list[int | None]:
        """The table `admit` would build, with -1 for a private block not yet allocated."""
        if hit.block_id is None:
            return []
        slot = hit.block_id if hit.length % self.block_size == 0 else -1
        return [None] * self.slot_index(hit.length) + [slot]

    def allocate_state(self, request_id: str, position: int) -> int:
        """A block for the state at `position` in the request's slot for it, the request
        holding no state yet (admitted without one: a tier load writes it); its id."""
        table = self.table(request_id)
        index = self.slot_index(position)
        if any(block_id is not None for block_id in table):
            raise InvariantError(f"mamba: request {request_id} already holds states")
        (block,) = self.pool.allocate(1)
        block.token_start = index * self.block_size
        table.extend([None] * (index + 1 - len(table)))
        table[index] = block.block_id
        return block.block_id

    # ------------------------------------------------------------------ chunk writes
    def plan_writes(
        self, table: Sequence[int | None], end: int, positions: Sequence[int]
    ) -> list[tuple[int, WriteKind]]:
        """How each state position of a chunk gets its block. `positions` ends with `end`."""
        plan = []
        for position in positions:
            if position == end or position % self.block_size == 0:
                index = self.slot_index(position)
                current = table[index] if index < len(table) else None
                if current is None:
                    kind = WriteKind.NEW_SLOT
                elif current >= 0 and self.pool.blocks[current].keys:
                    kind = WriteKind.MOVE_SLOT
                else:
                    kind = WriteKind.REUSE_SLOT
            else:
                kind = WriteKind.OWNED
            plan.append((position, kind))
        return plan

    @staticmethod
    def count_plan(plan: list[tuple[int, WriteKind]]) -> int:
        return sum(1 for _, kind in plan if kind is not WriteKind.REUSE_SLOT)

    def apply_writes(
        self,
        request_id: str,
        start: int,
        end: int,
        positions: Sequence[int],
        step: int,
    ) -> MambaWrites:
        table = self.table(request_id)
        read_block = None
        if start > 0:
            read_index = self.slot_index(start)
            read_block = table[read_index] if read_index < len(table) else None
            if read_block is None:
                raise InvariantError(
                    f"mamba: request {request_id} resumes at {start} but slot {read_index} "
                    "holds no state"
                )
        writes: list[tuple[int, int]] = []
        copies: list[BlockCopy] = []
        new_ids: list[int] = []
        for position, kind in self.plan_writes(table, end, positions):
            if kind is WriteKind.OWNED:
                block_id = self._owned_block(position)
                new_ids.append(block_id)
                writes.append((position, block_id))
                continue
            index = self.slot_index(position)
            if kind is WriteKind.NEW_SLOT:
                (block,) = self.pool.allocate(1)
                block.token_start = index * self.block_size
                table.extend([None] * (index + 1 - len(table)))
                table[index] = block.block_id
                new_ids.append(block.block_id)
            elif kind is WriteKind.MOVE_SLOT and self.pool.blocks[table[index]].pin_cnt:
                # a pin materialized on this live block's checkpoint: the pin keeps the block
                # and its keys; the request goes on in a private copy of it
                pinned = table[index]
                (private,) = self.pool.allocate(1)
                private.token_start = index * self.block_size
                key_position = self.pool.entries[self.pool.blocks[pinned].keys[0]].position
                self.hold(pinned)  # the copy reads it this step
                self.pool.free([pinned])  # the table's reference moves to the private block
                table[index] = private.block_id
                new_ids.append(private.block_id)
                copies.append(
                    BlockCopy(
                        self.group, pinned, private.block_id, "consumer", request_id, key_position
                    )
                )
            elif kind is WriteKind.MOVE_SLOT:
                live = table[index]
                (owned,) = self.pool.allocate(1)
                key_position = self.pool.entries[self.pool.blocks[live].keys[0]].position
                self.pool.move_hashes(live, owned.block_id)
                self.keep_allocated_until_step_end(owned)
                self.hold(live)
                self.mark_pending(owned, step, live)
                new_ids.append(owned.block_id)
                copies.append(
                    BlockCopy(
                        self.group, live, owned.block_id, "producer", request_id, key_position
                    )
                )
            writes.append((position, table[index]))
        return MambaWrites(read_block, writes, copies, new_ids)

    def release_passed(self, request_id: str, start: int, end: int) -> None:
        """The request computed `[start, end)`: hand back the slots it passed, those below the
        one its state at `end` lies in, that hold no state (the policy refused it, docs/rules.md
        section 5, or prefix caching is off) or only tail states (`TAIL_REASONS`), which stay
        cached there, evictable like any other. No chunk reads a passed slot again, since a
        chunk resumes from the slot holding its start. The table keeps the other states the
        request registered until it ends, as before (freed tail first then, so a family's
        shared states outlast its requests' tails), and its live state."""
        table = self.tables.get(request_id)
        if not table:
            return
        blocks, entries, passed = self.pool.blocks, self.pool.entries, []
        for index in range(self.slot_index(max(start, 1)), min(self.slot_index(end), len(table))):
            block_id = table[index]
            if block_id is not None and all(
                entries[key].reason in TAIL_REASONS for key in blocks[block_id].keys
            ):
                passed.append(block_id)
                table[index] = None
        if passed:
            self.pool.free(reversed(passed))

    def _owned_block(self, position: int) -> int:
        """A cache-owned block for the state at `position`, inside some slot's span."""
        (block,) = self.pool.allocate(1)
        block.token_start = self.slot_index(position) * self.block_size
        self.keep_allocated_until_step_end(block)
        return block.block_id

    def add_interval_writes(
        self, writes: list[tuple[int, int]], positions: Sequence[int]
    ) -> list[int]:
        """Give each interval position a cache-owned block while free blocks holding nothing
        retained longer than an interval state remain (an interval state never evicts a better
        one), inserting `(position, block)` into `writes`; returns the new block ids."""
        new_ids = []
        for position in positions:
            if not self.pool.num_free_up_to(INTERVAL_RETENTION, limit=1):
                break
            new_ids.append(self._owned_block(position))
            writes.append((position, new_ids[-1]))
        if new_ids:
            writes.sort()
        return new_ids

    def register(
        self,
        writes: Sequence[tuple[int, int]],
        hashes: Sequence[BlockHash],
        unit: int,
        reasons: dict[int, CheckpointReason],
        refused: Collection[int] = (),
    ) -> list[int]:
        """Register the checkpoints among a finished step's state writes, but for the `refused`
        positions (a chunk end the policy refused is written, as the live state, not kept);
        returns positions."""
        registered = []
        for position, block_id in writes:
            if position in refused:
                continue
            reason = reasons.get(position)
            if reason is None and position % self.block_size == 0:
                reason = CheckpointReason.BLOCK
            if reason is None or position // unit > len(hashes) or position % unit:
                continue
            parent = hashes[position // unit - 2] if position > unit else None
            self.pool.cache(block_id, [(hashes[position // unit - 1], position, reason)], parent)
            registered.append(position)
        return registered
