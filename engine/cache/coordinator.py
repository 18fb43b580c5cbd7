"""The hybrid coordinator: one token hit length that every group can serve, and the blocks,
copies and state writes of each step for both groups.

Lookup (docs/rules.md section 3, `engine.cache.lookup`): `A = attention(P - 1)`, `M = mamba(A)`,
hit `= M`; attention blocks are trimmed to `ceil(M / Ba)`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from engine.cache.attention import AttentionManager
from engine.cache.block_pool import BlockPool
from engine.cache.entry import CheckpointReason
from engine.cache.eviction.abilities import Admits, Learns, ReadsPrefixes, ReadsSupport
from engine.cache.lookup import HitGeometry, find_hit, reachable_hit
from engine.cache.mamba import MambaHit, MambaManager
from engine.cache.manager import BlockCopy
from engine.cache.support import StateSupport
from engine.config import CacheConfig
from engine.events import ATTENTION, MAMBA, EventSink
from engine.hashing import BlockHash


@dataclass(frozen=True)
class CacheHit:
    """The outcome of a lookup. `length` is the hit length; `attention_length` the attention
    match after the EAGLE drop, which a junction checkpoint materializes when it exceeds it."""

    length: int = 0
    attention_length: int = 0
    attention_block_ids: list[int] = field(default_factory=list)
    mamba: MambaHit = MambaHit(0, None, False)
    proof_length: int = 0  # the attention match before the EAGLE drop
    proof_limit: int = 0  # the most the proof could reach, floored to the match unit

    @property
    def is_pending(self) -> bool:
        """The checkpoint was moved this step and its copy has not run: retry next step."""
        return self.mamba.is_pending

    @property
    def by_group(self) -> dict[str, int]:
        return {ATTENTION: self.attention_length, MAMBA: self.length}


@dataclass
class StepWork:
    """What one request's step needs from the runner, besides its tokens."""

    attention_block_ids: list[int]
    mamba_read_block: int | None
    mamba_writes: list[tuple[int, int]]
    copies: list[BlockCopy]
    new_block_ids: dict[str, list[int]]


class HybridCoordinator:
    def __init__(self, config: CacheConfig, sink: EventSink, medium: str = "GPU") -> None:
        self.config = config
        self.unit = config.match_unit
        self.geometry = HitGeometry.of(config)
        attention_pool = BlockPool(
            config.num_blocks,
            config.attention_block_size,
            ATTENTION,
            0,
            sink,
            medium,
            config.eviction,
        )
        mamba_pool = BlockPool(
            config.mamba_num_blocks,
            config.mamba_block_size,
            MAMBA,
            1,
            sink,
            medium,
            config.eviction,
            holds_states=True,
        )
        if isinstance(mamba_pool.eviction, ReadsPrefixes):
            mamba_pool.eviction.couple(attention_pool.entries)
        # the attention blocks the cached states need, for a policy that reads them
        self.support: StateSupport | None = None
        if isinstance(attention_pool.eviction, ReadsSupport):
            self.support = StateSupport(attention_pool, self.unit)
            attention_pool.eviction.couple_support(self.support.counts)
            mamba_pool.on_evict = self.support.evicted
        # the Mamba pool's policy when it chooses which spare states are written, else None
        self.admission = mamba_pool.eviction if isinstance(mamba_pool.eviction, Admits) else None
        self.attention = AttentionManager(attention_pool)
        self.mamba = MambaManager(mamba_pool)
        self.step = 0

    @property
    def managers(self) -> tuple[AttentionManager, MambaManager]:
        return self.attention, self.mamba

    @property
    def pools(self) -> dict[str, BlockPool]:
        return {ATTENTION: self.attention.pool, MAMBA: self.mamba.pool}

    def begin_step(self, step: int) -> None:
        self.step = step
        for manager in self.managers:
            manager.pool.step = step

    # ------------------------------------------------------------------ lookup
    def lookup(self, hashes: Sequence[BlockHash], num_tokens: int, needs_logits: bool) -> CacheHit:
        """The longest prefix of a request both groups can serve (`engine.cache.lookup`, the
        rule a router predicts with, run over the pools' entries).

        A request that must produce logits may hit at most `num_tokens - 1` tokens; a pin
        materialization may hit all of them and takes no EAGLE drop.
        """
        found = find_hit(
            self.geometry,
            self.attention.pool.entries.get,
            self.mamba.pool.entries.get,
            hashes,
            num_tokens,
            needs_logits,
        )
        if found is None:
            return CacheHit()
        entry = found.state.value
        if entry is None:
            mamba = MambaHit(0, None, False)
        else:
            pending = self.mamba.pool.blocks[entry.block_id].pending_step is not None
            mamba = MambaHit(found.length, entry.block_id, pending)
        return CacheHit(
            found.length,
            found.attention_length,
            [e.block_id for e in found.attention.values],
            mamba,
            found.proof_length,
            found.proof_limit,
        )

    def reachable_hit(self, num_shared_tokens: int, num_tokens: int) -> int:
        """The hit a request of `num_tokens` would get if its first `num_shared_tokens` were
        cached in both groups (`engine.cache.lookup.reachable_hit`). This operation does not
        read or change the cache."""
        return reachable_hit(self.geometry, num_shared_tokens, num_tokens)

    # ------------------------------------------------------------------ allocation
    def count_admission(self, request_id: str, hit: CacheHit, end: int, positions: list[int]):
        """Free blocks per group that admitting at `hit` and running `[hit, end)` would take."""
        kept, cow_src = self.attention.split_hit(hit.attention_block_ids, hit.length)
        attention = self.attention.count_admission(kept, cow_src, end)
        plan = self.mamba.plan_writes(self.mamba.virtual_admission_table(hit.mamba), end, positions)
        mamba = self.mamba.count_admission(hit.mamba) + self.mamba.count_plan(plan)
        return {ATTENTION: attention, MAMBA: mamba}

    def count_chunk(self, request_id: str, end: int, positions: list[int]) -> dict[str, int]:
        plan = self.mamba.plan_writes(self.mamba.tables.get(request_id, []), end, positions)
        return {
            ATTENTION: self.attention.count_chunk(request_id, end),
            MAMBA: self.mamba.count_plan(plan),
        }

    def can_allocate(self, need: dict[str, int]) -> bool:
        return all(need[name] <= pool.num_free for name, pool in self.pools.items())

    def admit(self, request_id: str, hit: CacheHit) -> list[BlockCopy]:
        kept, cow_src = self.attention.split_hit(hit.attention_block_ids, hit.length)
        copies = self.attention.admit(request_id, kept, cow_src, hit.length)
        copies += self.mamba.admit(request_id, hit.mamba)
        return copies

    def allocate_chunk(
        self, request_id: str, start: int, end: int, positions: list[int]
    ) -> StepWork:
        new_attention = self.attention.allocate_chunk(request_id, end)
        mamba = self.mamba.apply_writes(request_id, start, end, positions, self.step)
        table = self.attention.tables[request_id]
        return StepWork(
            attention_block_ids=list(table),
            mamba_read_block=mamba.read_block,
            mamba_writes=mamba.writes,
            copies=mamba.copies,
            new_block_ids={ATTENTION: new_attention, MAMBA: mamba.new_block_ids},
        )

    def observe(self, hashes: Sequence[BlockHash]) -> int | None:
        """A request is being admitted for the first time: its prompt's chain is shown to both
        pools' eviction policies before its states are chosen, and they may learn from it
        (`Learns.observe`, asked of a policy that learns). Returns the position where, as the
        Mamba pool's policy learnt, the prompt branched off earlier ones that went on; None if
        nowhere known."""
        attention, mamba = self.attention.pool.eviction, self.mamba.pool.eviction
        if isinstance(attention, Learns):
            attention.observe(hashes)
        branched = mamba.observe(hashes) if isinstance(mamba, Learns) else None
        return None if branched is None else branched * self.unit

    def refused_states(
        self,
        hashes: Sequence[BlockHash],
        num_prompt_tokens: int,
        hit_length: int,
        targets: dict[int, CheckpointReason],
    ) -> frozenset[int]:
        """The states the Mamba pool's policy will not have this request write (docs/rules.md
        section 5: admission): asked only for the policy's `REFUSABLE` states above the hit (a
        message state only when the state after it is written), and only while the pool lacks
        a spare block (one with no entry) for each state the prompt writes, so without
        pressure every state is written."""
        policy = self.admission
        if policy is None or not self.config.enable_prefix_caching:
            return frozenset()
        size, unit = self.mamba.block_size, self.unit
        positions = sorted(
            {*range((hit_length // size + 1) * size, num_prompt_tokens + 1, size)}
            | {p for p in targets if p > hit_length}
        )
        if not positions or policy.num_free_up_to(0, limit=len(positions) + 1) > len(positions):
            return frozenset()
        refusable = policy.REFUSABLE
        refused = set()
        # deepest first: a message state is asked only when the state after it is written
        for position, following in reversed(
            list(zip(positions, [*positions[1:], None], strict=True))
        ):
            reason = targets.get(position, CheckpointReason.BLOCK)
            if reason not in refusable or position % unit or position // unit > len(hashes):
                continue
            if reason is CheckpointReason.MESSAGE and (following is None or following in refused):
                continue
            first = position // unit - 1
            last = len(hashes) if following is None else following // unit - 1
            if not policy.admits(hashes[first], reason, hashes[first : max(last, first + 1)]):
                refused.add(position)
        return frozenset(refused)

    def tell_refused(
        self,
        hashes: Sequence[BlockHash],
        refused: Collection[int],
        targets: dict[int, CheckpointReason],
    ) -> None:
        """The request `refused_states` answered for is admitted: its refused states are told
        to the Mamba pool's policy once (`Admits.refused`), however many times a waiting
        request asked."""
        policy, unit = self.admission, self.unit
        if policy is None:  # nothing was refused
            return
        for position in sorted(refused):
            policy.refused(
                hashes[position // unit - 1], targets.get(position, CheckpointReason.BLOCK)
            )

    def add_interval_states(
        self, start: int, end: int, writes: list[tuple[int, int]], hashes: Sequence[BlockHash]
    ) -> list[int]:
        """The interval states strictly inside the chunk `[start, end)` that `writes` lacks and
        the Mamba pool's policy admits, added where spare blocks allow (docs/rules.md section 5:
        interval states); new Mamba block ids."""
        interval = self.config.state_interval
        if not interval or end - start < 2:
            return []
        have = {position for position, _ in writes}
        first = (start // interval + 1) * interval
        positions = [p for p in range(first, end, interval) if p not in have]
        policy, unit = self.admission, self.unit
        if policy is not None:
            interval_reason = CheckpointReason.INTERVAL
            positions = [
                p
                for p in positions
                if p // unit <= len(hashes)
                and policy.admits(hashes[p // unit - 1], interval_reason)
            ]
        return self.mamba.add_interval_writes(writes, positions) if positions else []

    # ------------------------------------------------------------------ after the forward
    def register_attention(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        registered_upto: int,
        computed_upto: int,
        reasons: dict[int, CheckpointReason],
    ) -> int:
        if not self.config.enable_prefix_caching:
            return computed_upto
        return self.attention.register(
            request_id,
            hashes,
            registered_upto,
            computed_upto,
            self.unit,
            self.config.is_fine_grained,
            reasons,
        )

    def register_mamba(
        self,
        writes: Sequence[tuple[int, int]],
        hashes: Sequence[BlockHash],
        reasons: dict[int, CheckpointReason],
        refused: Collection[int] = (),
    ) -> list[int]:
        if not self.config.enable_prefix_caching:
            return []
        registered = self.mamba.register(writes, hashes, self.unit, reasons, refused)
        if self.support is not None:
            for position in registered:
                self.support.cached(hashes, position)
        return registered

    def release_passed(self, request_id: str, start: int, end: int) -> None:
        """The request computed `[start, end)`: the Mamba slots it passed that hold no state or
        only tail states go back to the pool (`MambaManager.release_passed`)."""
        self.mamba.release_passed(request_id, start, end)

    def block_tables(self, request_id: str) -> dict[str, list[int | None]]:
        """The request's block ids per group, in table order (`None`: no Mamba state kept)."""
        return {m.group: list(m.tables.get(request_id, [])) for m in self.managers}

    def free_request(self, request_id: str) -> None:
        for manager in self.managers:
            manager.free_request(request_id)

    def end_step(self) -> None:
        for manager in self.managers:
            manager.end_step()

    def check_invariants(self) -> None:
        for manager in self.managers:
            manager.check_invariants()
        if self.support is not None:
            self.support.check_invariants(self.mamba.pool.entries)
