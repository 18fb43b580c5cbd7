"""The attention group: paged KV blocks of `Ba` tokens (`Ba * D` under DCP).

Interval map of one block `[s, s + Ba)`: positions below the owner's computed count hold KV;
keys `H_p` for `s < p <= s + Ba` say "tokens `[s, p)` here continue the prefix `H_s`". The owner
only appends, so keys stay true while it writes; a consumer whose hit ends inside the block
would overwrite the owner's tail, so it writes a private copy instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.cache.entry import CheckpointReason
from engine.cache.manager import BlockCopy, GroupManager
from engine.hashing import BlockHash


class AttentionManager(GroupManager):
    def split_hit(self, hit_block_ids: list[int], hit_length: int) -> tuple[list[int], int | None]:
        """Blocks a request keeps for a hit of `hit_length`, and the shared tail to copy."""
        kept = hit_block_ids[: -(-hit_length // self.block_size)]
        if hit_length % self.block_size and kept:
            return kept[:-1], kept[-1]
        return kept, None

    def count_admission(self, kept: list[int], cow_src: int | None, end: int) -> int:
        """Free blocks admission takes: touched cached blocks plus new ones up to `end`."""
        touched = [*kept, cow_src] if cow_src is not None else kept
        num_touched_free = sum(1 for b in touched if self.pool.is_free(b))
        table_len = len(kept) + (1 if cow_src is not None else 0)
        new = (1 if cow_src is not None else 0) + max(0, -(-end // self.block_size) - table_len)
        return num_touched_free + new

    def admit(
        self, request_id: str, kept: list[int], cow_src: int | None, hit_length: int
    ) -> list[BlockCopy]:
        table = self.table(request_id)
        for block_id in kept:
            self.pool.touch(block_id)
        table.extend(kept)
        if cow_src is None:
            return []
        self.hold(cow_src)
        (private,) = self.pool.allocate(1)
        private.token_start = len(table) * self.block_size
        table.append(private.block_id)
        self.hold(private.block_id)
        return [
            BlockCopy(self.group, cow_src, private.block_id, "consumer", request_id, hit_length)
        ]

    def count_chunk(self, request_id: str, end: int) -> int:
        return max(0, -(-end // self.block_size) - len(self.tables.get(request_id, ())))

    def allocate_chunk(self, request_id: str, end: int) -> list[int]:
        table = self.table(request_id)
        new = self.pool.allocate(self.count_chunk(request_id, end))
        for block in new:
            block.token_start = len(table) * self.block_size
            table.append(block.block_id)
        return [b.block_id for b in new]

    def register(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        registered_upto: int,
        computed_upto: int,
        unit: int,
        fine_grained: bool,
        reasons: Mapping[int, CheckpointReason],
    ) -> int:
        """Register keys for the units in `(registered_upto, computed_upto]`; returns the new
        registered position. Only full blocks get keys unless hits are fine-grained."""
        size = self.block_size
        step = unit if fine_grained else size
        first = (registered_upto // step + 1) * step
        last = min(computed_upto, len(hashes) * unit) // step * step
        if last < first:
            return registered_upto
        table = self.tables[request_id]
        cache, get_reason, default = self.pool.cache, reasons.get, CheckpointReason.BLOCK
        # the keys of one block at a time, each block's with its parent: the key before it
        pending: list[tuple[BlockHash, int, CheckpointReason]] = []
        block_index = (first - 1) // size
        for position in range(first, last + 1, step):
            index = (position - 1) // size
            if index != block_index:
                start = block_index * size
                cache(table[block_index], pending, hashes[start // unit - 1] if start else None)
                pending = []
                block_index = index
            pending.append((hashes[position // unit - 1], position, get_reason(position, default)))
        start = block_index * size
        cache(table[block_index], pending, hashes[start // unit - 1] if start else None)
        return last
