"""One group's physical blocks: reference counts, entries and pins, over an eviction policy.

A block is exactly one of free (in the policy's free queues; `cached` when it still holds
entries), in use (referenced by a request table or held by a step's copy), or pinned (held by an
operator's pin; it may also be in use). Which free block an allocation takes, evicting its
entries, is the eviction policy's choice (`engine.cache.eviction`, `CacheConfig.eviction`; by
default the least recently freed block of the lowest retention level).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.cache.block import Block, InvariantError, NoFreeBlocksError
from engine.cache.entry import REASON_VALUE, RETENTION, CheckpointReason, Entry, highest_retention
from engine.cache.eviction import DEFAULT_EVICTION, make_policy
from engine.events import BlockHashesMoved, BlockRemoved, BlockStored, EventSink, NullSink
from engine.hashing import BlockHash


class BlockPool:
    """The blocks of one cache group and the map from keys to the blocks that hold them."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        group: str,
        group_idx: int,
        sink: EventSink | None = None,
        medium: str = "GPU",
        eviction: str = DEFAULT_EVICTION,
        holds_states: bool = False,
    ) -> None:
        self.block_size = block_size
        self.group = group
        self.group_idx = group_idx
        self.medium = medium
        self.sink: EventSink = sink or NullSink()
        # nobody listens: build no events and track no changed rows (the step's hot path)
        self.is_recording = self.sink.is_recording
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.entries: dict[BlockHash, Entry] = {}
        # holds_states: one recurrent state per block (the Mamba pool), else attention KV
        self.eviction = make_policy(eviction, self.blocks, self.entries, holds_states)
        for block in self.blocks:
            self.eviction.add(block)
        self._num_pinned = 0
        self.dirty: set[int] = set()
        self.step = 0
        # told the keys of every block evicted, before they are dropped (`StateSupport`)
        self.on_evict: Callable[[list[BlockHash]], None] | None = None

    # ------------------------------------------------------------------ queries
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take, cached ones included."""
        return self.eviction.num_free

    def num_free_up_to(self, retention: int, limit: int | None = None) -> int:
        """Blocks allocations take before one holding an entry retained above `retention`,
        counted up to `limit`."""
        return self.eviction.num_free_up_to(retention, limit)

    @property
    def num_pinned(self) -> int:
        return self._num_pinned

    def get(self, key: BlockHash) -> Entry | None:
        return self.entries.get(key)

    def is_free(self, block_id: int) -> bool:
        return self.blocks[block_id].free_queue is not None

    # ------------------------------------------------------------------ bookkeeping
    def _touch_changed(self, block: Block) -> None:
        block.last_change = self.step
        if self.is_recording:
            self.dirty.add(block.block_id)

    # ------------------------------------------------------------------ actions
    def allocate(self, num: int) -> list[Block]:
        """Take `num` blocks for exclusive use (ref 1), evicting what they cached."""
        num_free = self.eviction.num_free
        if num > num_free:
            raise NoFreeBlocksError(
                f"{self.group}: asked for {num} blocks, {num_free} free of {self.num_blocks}"
            )
        taken = self.eviction.take(num)
        step = self.step
        dirty = self.dirty if self.is_recording else None
        for block in taken:
            if block.keys:
                self.evict(block)
            block.ref_cnt = 1
            block.token_start = None
            block.last_change = step
            if dirty is not None:
                dirty.add(block.block_id)
        return taken

    def evict(self, block: Block) -> None:
        """Drop every entry the block holds (it is about to be reused)."""
        if not block.keys:
            return
        keys, entries = block.keys, self.entries
        if self.on_evict is not None:
            self.on_evict(keys)
        block.keys = []
        block.retention = 0
        if not self.is_recording:  # nobody listens: no event to build
            for key in keys:
                del entries[key]
            return
        removed = [entries.pop(key) for key in keys]
        self.sink.emit(
            BlockRemoved(
                block_hashes=[entry.key_hex for entry in removed],
                group_idx=self.group_idx,
                group=self.group,
                block_ids=[block.block_id],
                medium=self.medium,
            )
        )

    def reorder(self, key: BlockHash) -> None:
        """What the key is worth to the eviction policy changed (not its entry): a free block
        holding it may move in the order."""
        entry = self.entries.get(key)
        if entry is not None:
            block = self.blocks[entry.block_id]
            if block.free_queue is not None:
                self.eviction.update(block)

    def touch(self, block_id: int) -> None:
        """Add a reference: a request table or a step's copy now holds the block."""
        block = self.blocks[block_id]
        if block.free_queue is not None:
            self.eviction.remove(block)
        block.ref_cnt += 1
        block.last_change = self.step
        if self.is_recording:
            self.dirty.add(block_id)

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the order given (pass a table reversed)."""
        blocks, step = self.blocks, self.step
        dirty = self.dirty if self.is_recording else None
        released: list[Block] = []  # no reference and no pin left: they join the free blocks
        try:
            for block_id in block_ids:
                block = blocks[block_id]
                ref_cnt = block.ref_cnt - 1
                if ref_cnt < 0:
                    raise InvariantError(f"{self.group} block {block_id}: freed with ref_cnt 0")
                block.ref_cnt = ref_cnt
                block.last_change = step
                if dirty is not None:
                    dirty.add(block_id)
                if ref_cnt == 0 and block.pin_cnt == 0:
                    released.append(block)
        finally:  # the blocks released before a bad id still join, in their order
            if released:
                self.eviction.add_all(released)

    def pin(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.free_queue is not None:
            self.eviction.remove(block)
        if block.pin_cnt == 0:
            self._num_pinned += 1
        block.pin_cnt += 1
        self._touch_changed(block)

    def unpin(self, block_id: int) -> None:
        """Release one pin; a block no pin holds any more keeps its entries as `block` ones."""
        block = self.blocks[block_id]
        if block.pin_cnt <= 0:
            raise InvariantError(f"{self.group} block {block_id}: unpinned while not pinned")
        block.pin_cnt -= 1
        self._touch_changed(block)
        if block.pin_cnt == 0:
            self._num_pinned -= 1
            for key in block.keys:
                entry = self.entries[key]
                if entry.reason is CheckpointReason.PIN:
                    entry.reason = CheckpointReason.BLOCK
            block.retention = self.retention_of(block)
            if block.ref_cnt == 0:
                self.eviction.add(block)

    def cache(
        self,
        block_id: int,
        keys: list[tuple[BlockHash, int, CheckpointReason]],
        parent: BlockHash | None,
    ) -> list[BlockHash]:
        """Register `(key, position, reason)` entries on a block; returns the keys added.

        A key another block already holds is left where it is, its reason raised if need be.
        """
        blocks, entries = self.blocks, self.entries
        block = blocks[block_id]
        block_keys = block.keys
        added: list[Entry] = []
        max_position = 0
        reason: CheckpointReason | None = None
        retention = -1  # of `reason`
        for key, position, why in keys:
            entry = entries.get(key)
            why_retention = RETENTION[why]
            if entry is not None:
                if why_retention > RETENTION[entry.reason]:
                    entry.reason = why
                    holder = blocks[entry.block_id]
                    if why_retention > holder.retention:
                        holder.retention = why_retention
                    if holder.free_queue is not None:  # `update` does nothing for a held one
                        self.eviction.update(holder)
                    self._touch_changed(holder)
                continue
            entry = Entry(key, block_id, position, why)
            entries[key] = entry
            block_keys.append(key)
            added.append(entry)
            if position > max_position:
                max_position = position
            if why_retention > retention:
                reason, retention = why, why_retention
        if not added:
            return []
        start = (max_position - 1) // self.block_size * self.block_size
        block.token_start = start
        if retention > block.retention:
            block.retention = retention
        if block.free_queue is not None:  # `update` does nothing for a held block
            self.eviction.update(block)
        block.last_change = self.step
        if self.is_recording:
            self.dirty.add(block_id)
            self._emit_stored(block_id, added, parent, start, max_position, reason)
        return [entry.key for entry in added]

    def _emit_stored(
        self,
        block_id: int,
        added: list[Entry],
        parent: BlockHash | None,
        start: int,
        end: int,
        reason: CheckpointReason | None,
    ) -> None:
        self.sink.emit(
            BlockStored(
                block_hashes=[entry.key_hex for entry in added],
                parent_block_hash=parent.hex() if parent is not None else None,
                block_size=self.block_size,
                group_idx=self.group_idx,
                group=self.group,
                block_ids=[block_id],
                token_range=(start, end),
                is_partial=end % self.block_size != 0,
                checkpoint_reason=REASON_VALUE[reason] if reason is not None else None,
                medium=self.medium,
            )
        )

    def move_hashes(self, src_id: int, dst_id: int) -> None:
        """Re-point every entry of `src` at `dst` (producer copy-on-write); no store/remove."""
        src, dst = self.blocks[src_id], self.blocks[dst_id]
        if src.pin_cnt:
            raise InvariantError(f"{self.group} block {src_id}: cannot move hashes of a pin")
        moved = src.keys
        src.keys = []
        for key in moved:
            self.entries[key].block_id = dst_id
        dst.keys.extend(moved)
        dst.token_start = src.token_start
        dst.retention = max(dst.retention, src.retention)
        src.retention = 0
        self.eviction.update(src)
        self.eviction.update(dst)
        self._touch_changed(src)
        self._touch_changed(dst)
        if not self.is_recording:
            return
        self.sink.emit(
            BlockHashesMoved(
                group_idx=self.group_idx,
                group=self.group,
                block_hashes=[self.entries[key].key_hex for key in moved],
                src_block_id=src_id,
                dst_block_id=dst_id,
            )
        )

    def row(self, block: Block) -> dict:
        """The block as the block table shows it (the snapshot's and the store's row)."""
        end = None
        reason = None
        retention = -1
        entries = self.entries
        keys = []
        for key in block.keys:
            entry = entries[key]
            keys.append(entry.key_hex)
            if end is None or entry.position > end:
                end = entry.position
            if RETENTION[entry.reason] > retention:
                reason, retention = entry.reason, RETENTION[entry.reason]
        return {
            "group": self.group,
            "block_id": block.block_id,
            "state": block.state,
            "keys": keys,
            "token_range": [block.token_start, end] if end is not None else None,
            "is_partial": end is not None and end % self.block_size != 0,
            "checkpoint_reason": REASON_VALUE[reason] if reason is not None else None,
            "ref_cnt": block.ref_cnt,
            "pinned": block.pin_cnt > 0,
            "last_change": block.last_change,
        }

    def retention_of(self, block: Block) -> int:
        """The highest retention among the block's entries, 0 for none, counted from the
        entries (what `Block.retention` must equal). Changes nothing."""
        return highest_retention(block.keys, self.entries)

    def take_dirty(self) -> list[Block]:
        dirty = [self.blocks[i] for i in sorted(self.dirty)]
        self.dirty.clear()
        return dirty

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first block whose bookkeeping is inconsistent:
        counts and entries here, then the eviction policy's queues."""
        for block in self.blocks:
            name = f"{self.group} block {block.block_id}"
            if block.ref_cnt < 0 or block.pin_cnt < 0:
                raise InvariantError(
                    f"{name}: negative count ref={block.ref_cnt} pins={block.pin_cnt}"
                )
            is_queued = block.free_queue is not None
            should_be_free = block.ref_cnt == 0 and block.pin_cnt == 0
            if is_queued != should_be_free:
                raise InvariantError(
                    f"{name}: state {block.state} but free-queued={is_queued} "
                    f"(ref={block.ref_cnt}, pins={block.pin_cnt})"
                )
            for key in block.keys:
                entry = self.entries.get(key)
                if entry is None or entry.block_id != block.block_id:
                    raise InvariantError(f"{name}: lists key {key.hex()} it does not own")
            if block.retention != self.retention_of(block):
                raise InvariantError(
                    f"{name}: stored retention {block.retention} but its entries call for "
                    f"{self.retention_of(block)}"
                )
        for key, entry in self.entries.items():
            block = self.blocks[entry.block_id]
            if key not in block.keys:
                raise InvariantError(
                    f"{self.group} block {entry.block_id}: entry {key.hex()} not listed on it"
                )
            if block.token_start is None or not (
                block.token_start < entry.position <= block.token_start + self.block_size
            ):
                raise InvariantError(
                    f"{self.group} block {entry.block_id}: entry at position {entry.position} "
                    f"outside the block's span from {block.token_start}"
                )
        num_pinned = sum(1 for b in self.blocks if b.pin_cnt)
        if num_pinned != self._num_pinned:
            raise InvariantError(f"{self.group}: pinned count {self._num_pinned} != {num_pinned}")
        try:
            self.eviction.check_invariants()
        except InvariantError as error:
            raise InvariantError(f"{self.group} {error}") from None
