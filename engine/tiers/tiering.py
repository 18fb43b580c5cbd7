"""The tiers under the device pools, wired to them: what the device gives up goes down as a
usable-hit unit, and a lookup finds the longest usable hit over the device and the tiers.

**Down.** When the Mamba pool gives up a block holding a state `H_p` (an allocation reuses it),
the state is worth keeping only with its attention prefix. The unit saved is the attention of
`[q, p)` and the state at `p`, where `q` is the deepest position below `p` whose unit a tier
already holds (0 for none): the tiers never hold a run of attention twice, and a chain of units
rebuilds `[0, p)`. The attention of `[q, p)` must still be on the device (else the state is
unbacked and goes nowhere). The copy itself is the runner's, first in the step
(`engine.tiers.moves.UnitSave`), and the unit enters the tiers in `Scheduler.update`.

**Up.** `find` looks for the deepest position `p`, above the device's own hit and on its hit
grid, whose unit some tier holds with every unit before it back to a position `c` that the
device's attention reaches. Then the request is admitted at `c` over the device's attention
blocks, its blocks for `[c, p)` and a state block at `p` are allocated, and the runner writes
the units' rows and the leaf's state there in the step (`UnitLoad`), while the other requests of
the step run; the request computes from `p` in the next step. The hit is `p`: the lookup rule
(`engine.cache.lookup`) run over the union of the device and the tiers. A load whose bytes would
take longer over the measured bandwidths than prefilling the tokens it saves is not taken
(`TierCosts`), and counted.

With EAGLE a hit needs the attention one unit past it, which a unit does not carry: no lookup
reads the tiers then (the device's own hits are unchanged).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.cache.block_pool import BlockPool
from engine.cache.coordinator import CacheHit, HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.cache.eviction.abilities import Demotes
from engine.cache.lookup import attention_match
from engine.cache.mamba import MambaHit
from engine.events import ATTENTION, MAMBA, BlockRemoved, BlockStored, EventSink, UnitLoaded
from engine.hashing import BlockHash
from engine.tiers.counters import ReadTimes
from engine.tiers.index import Record
from engine.tiers.moves import UnitSave
from engine.tiers.shared import SHARED, SharedStats, SharedTier
from engine.tiers.stack import DISK, HOST, StackStats, TierStack
from engine.tiers.unit import TierUnit


@dataclass(frozen=True)
class TierCosts:
    """What a load costs against what it saves: the tiers' read bandwidths and the runner's
    prefill rate. A load is refused when its bytes take longer than prefilling its tokens."""

    host_bytes_per_s: float
    disk_bytes_per_s: float
    prefill_tokens_per_s: float
    shared_bytes_per_s: float | None = None  # None: priced as the disk

    def load_seconds(self, bytes_by_place: dict[str, int]) -> float:
        return (
            bytes_by_place.get(HOST, 0) / self.host_bytes_per_s
            + bytes_by_place.get(DISK, 0) / self.disk_bytes_per_s
            + bytes_by_place.get(SHARED, 0) / (self.shared_bytes_per_s or self.disk_bytes_per_s)
        )

    def prefill_seconds(self, num_tokens: int) -> float:
        return num_tokens / self.prefill_tokens_per_s


class TierPlan(NamedTuple):
    """A hit that needs loads: the device serves `[0, start)`, the tiers `[start, length)`."""

    length: int
    start: int
    attention_block_ids: list[int]  # the device's blocks over `[0, start)`
    keys: list[BlockHash]  # the units to load, root first
    num_bytes: int

    def as_hit(self, device: CacheHit) -> CacheHit:
        """The hit as the rest of admission sees it (in-flight sharing, junctions, miss
        attribution): the device's lookup with the length, and the proof, this plan reaches.
        No blocks: the plan's own admission takes them."""
        return CacheHit(
            self.length,
            max(device.attention_length, self.length),
            [],
            MambaHit(0, None, False),
            max(device.proof_length, self.length),
            device.proof_limit,
        )


@dataclass(frozen=True)
class TieringStats:
    num_saves: int  # states the device gave up that went down as units
    num_unbacked: int  # states given up whose attention prefix the device no longer held
    num_declined: int  # states given up that the pool's policy said are not worth a tier
    num_loads: int  # requests whose hit was read from the tiers
    num_loaded_tokens: int  # tokens those hits served beyond the device's own
    num_loaded_bytes: int
    num_refused_slow: int  # tier hits not taken: loading would take longer than prefilling
    stack: StackStats
    num_shared_loads: int = 0  # of `num_loads`, those that read a unit from the shared tier
    num_shared_loaded_tokens: int = 0  # tokens of those loads read from the shared tier
    num_published: int = 0  # units sent to the shared tier while their state was on device
    shared: SharedStats | None = None  # None without a shared tier
    # each tier's share of the loads: hit tokens served, and how long reading its units took
    loaded_tokens_by_medium: dict[str, int] = field(default_factory=dict)
    read_times: dict[str, ReadTimes] = field(default_factory=dict)


class Tiering:
    def __init__(
        self,
        stack: TierStack,
        coordinator: HybridCoordinator,
        sink: EventSink,
        costs: TierCosts | None = None,
        disk_by_policy: bool = False,
        shared: SharedTier | None = None,
    ) -> None:
        self.stack = stack
        self.shared = shared
        # states being saved only to be published to the shared tier (their device block
        # stays), those of this step's saves, and the records a lookup found in the store
        self._publish: set[BlockHash] = set()
        self._publishing: set[BlockHash] = set()
        self._remote: dict[BlockHash, Record] = {}
        self.num_shared_loads = self.num_shared_loaded_tokens = self.num_published = 0
        self.coordinator = coordinator
        self.sink = sink
        self.costs = costs
        self.unit = coordinator.unit
        self.geometry = coordinator.geometry
        # each state key on the device -> the chain of hashes of the request that wrote it
        # (a reference to that request's list; its first `p / U` entries are the state's)
        self.chains: dict[BlockHash, Sequence[BlockHash]] = {}
        self.saves: list[UnitSave] = []
        self._pending: set[BlockHash] = set()  # the keys of `saves`
        # each state key on the device -> the attention keys of its own span (the blocks since
        # the deepest state before it), and each such attention key -> the states it is in
        self.spans: dict[BlockHash, list[BlockHash]] = {}
        self.owners: dict[BlockHash, set[BlockHash]] = {}
        self.num_saves = self.num_unbacked = self.num_declined = self.num_loads = 0
        self.num_loaded_tokens = self.num_loaded_bytes = self.num_refused_slow = 0
        self.loaded_tokens_by_medium: dict[str, int] = {}
        self.read_times: dict[str, ReadTimes] = {}
        # the reason of each unit sent down, while a tier may hold it: what the policy is asked
        # when host memory gives the unit up (is it worth a disk file?)
        self.reasons: dict[BlockHash, CheckpointReason] = {}
        if disk_by_policy and isinstance(coordinator.mamba.pool.eviction, Demotes):
            stack.worth_disk = self._worth_disk
        self._listen(coordinator.mamba.pool, self._evicted)
        self._listen(coordinator.attention.pool, self._attention_evicted)
        if sink.is_recording:  # a disk tier reopened after a restart: its units start the epoch
            self._announce((set(), set()))

    @staticmethod
    def _listen(pool: BlockPool, listener: Callable[[list[BlockHash]], None]) -> None:
        """Have `listener` told the keys of each block the pool gives up, before whoever was
        told already (the entries are still there for both)."""
        before = pool.on_evict

        def evicted(keys: list[BlockHash]) -> None:
            listener(keys)
            if before is not None:
                before(keys)

        pool.on_evict = evicted

    # ------------------------------------------------------------------ down
    def registered(self, hashes: Sequence[BlockHash], positions: Sequence[int]) -> None:
        """The device registered states at `positions` of the chain `hashes`: each is
        remembered with its chain, and under the attention keys of its own span, the blocks
        from the deepest state before it (on the device or in a tier) up to it."""
        unit, size = self.unit, self.coordinator.attention.block_size
        states, stack = self.coordinator.mamba.pool.entries, self.stack
        for position in positions:
            key = hashes[position // unit - 1]
            if key in self.chains:
                continue
            self.chains[key] = hashes
            start = 0
            for index in range(position // unit - 1, 0, -1):
                candidate = hashes[index - 1]
                if candidate in states or stack.holds(candidate):
                    start = index * unit
                    break
            span = [
                hashes[min((block + 1) * size, position) // unit - 1]
                for block in range(start // size, (position - 1) // size + 1)
            ]
            self.spans[key] = span
            for attention_key in span:
                self.owners.setdefault(attention_key, set()).add(key)
            self._publish_state(key, hashes)

    def _publish_state(self, key: BlockHash, hashes: Sequence[BlockHash]) -> None:
        """With a shared tier, a state the device registers goes there now, as a unit over the
        deepest unit before it that the store has (what another engine loads: a prefix is
        worth sharing while it is hot, not once this engine gives it up). Interval states are
        spares, not where prompts part: they are not sent."""
        shared, entry = self.shared, self.coordinator.mamba.pool.entries.get(key)
        if shared is None or entry is None or entry.reason is CheckpointReason.INTERVAL:
            return
        if key in self._pending or key in shared.known:
            return
        state_block = self.coordinator.mamba.filled_from(entry.block_id)
        save = self._save(key, state_block, entry.position, hashes, self._pending, local=False)
        if save is not None:
            self.saves.append(save)
            self._pending.add(key)
            self._publish.add(key)

    def _forget(self, key: BlockHash) -> Sequence[BlockHash] | None:
        """The device gave up the state `key`: its chain, no longer remembered."""
        hashes = self.chains.pop(key, None)
        for attention_key in self.spans.pop(key, ()):
            owners = self.owners[attention_key]
            owners.discard(key)
            if not owners:
                del self.owners[attention_key]
        return hashes

    def _evicted(self, keys: list[BlockHash]) -> None:
        """The Mamba pool gives up a block: its states go down (`_send_down`); one a tier
        holds already is refreshed there."""
        for key in keys:
            hashes = self._forget(key)
            if hashes is None:
                continue
            if key in self.stack.host:
                self.stack.host.index.touch(key)
            self._send_down(key, hashes)

    def _attention_evicted(self, keys: list[BlockHash]) -> None:
        """The attention pool gives up a block: the device's states whose own span holds it
        (the shallowest past it on each chain) stop being usable there, so they go down now,
        while the block's rows can still be copied; a deeper one goes down when it is given
        up itself, over the unit saved now."""
        owners = self.owners
        found = {state for key in keys for state in owners.get(key, ())}
        if not found:
            return
        states = self.coordinator.mamba.pool.entries
        for state in sorted(found, key=lambda state: states[state].position):
            self._send_down(state, self.chains[state])

    def _send_down(self, key: BlockHash, hashes: Sequence[BlockHash]) -> None:
        """Save the device's state `key` (of the chain `hashes`) as a unit this step, unless a
        tier holds it, it is being saved, or the pool's policy says it is not worth it."""
        pool = self.coordinator.mamba.pool
        if key in self._publish:  # being copied out for the shared tier: the tiers take it too
            self._publish.discard(key)
            return
        if key in self._pending or self.stack.holds(key):
            return
        entry = pool.entries[key]
        if isinstance(pool.eviction, Demotes) and not pool.eviction.worth_keeping_below(
            key, entry.reason
        ):
            self.num_declined += 1
            return
        # a block whose keys moved this step is filled by the step's copy, after the saves:
        # its state is read from the copy's source, which holds it until the forward
        state_block = self.coordinator.mamba.filled_from(entry.block_id)
        save = self._save(key, state_block, entry.position, hashes, self._pending)
        if save is None:
            self.num_unbacked += 1
        else:
            self.saves.append(save)
            self._pending.add(key)
            self.reasons[key] = entry.reason

    def _worth_disk(self, key: BlockHash) -> bool:
        """Host memory gives the unit `key` up: it goes to disk when the Mamba pool's policy
        says a state of its reason is worth a tier, as when the device gave it up."""
        policy = self.coordinator.mamba.pool.eviction
        reason = self.reasons.get(key, CheckpointReason.BLOCK)
        return not isinstance(policy, Demotes) or policy.worth_keeping_below(key, reason)

    def _save(
        self,
        key: BlockHash,
        state_block: int,
        position: int,
        hashes: Sequence[BlockHash],
        pending: set[BlockHash],
        local: bool = True,
    ) -> UnitSave | None:
        """The save of the state `key` over the deepest unit before it in `pending` or in a
        tier of this engine (`local`), or else in the shared store as this engine knows it."""
        unit = self.unit
        start, parent = 0, None
        below = self.stack.holds if local or self.shared is None else self.shared.known.__contains__
        for index in range(position // unit - 1, 0, -1):  # deepest first
            candidate = hashes[index - 1]
            if candidate in pending or below(candidate):
                start, parent = index * unit, candidate
                break
        blocks = self._device_blocks(hashes, start, position)
        if blocks is None:
            return None
        return UnitSave(key, parent, start, position, blocks, state_block)

    def _device_blocks(
        self, hashes: Sequence[BlockHash], start: int, end: int
    ) -> tuple[int, ...] | None:
        """The device's attention blocks holding `[start, end)` of the chain, in order; None
        when one is gone. Each block is found by its key at its end (or at `end`): a chain
        hash names the whole prefix, so its block holds the chain's tokens up to it."""
        entries, unit = self.coordinator.attention.pool.entries, self.unit
        size = self.coordinator.attention.block_size
        blocks = []
        for index in range(start // size, (end - 1) // size + 1):
            entry = entries.get(hashes[min((index + 1) * size, end) // unit - 1])
            if entry is None:
                return None
            blocks.append(entry.block_id)
        return tuple(blocks)

    def save_device(self) -> list[UnitSave]:
        """Every state on the device that no tier holds, as saves, shallowest first (each
        over the units before it): what a clean stop sends down. Call between steps."""
        states = self.coordinator.mamba.pool.entries
        for key in sorted(self.chains, key=lambda key: states[key].position):
            self._send_down(key, self.chains[key])
        return self.take_saves()

    @property
    def publishing(self) -> bool:
        """Saves for the shared tier wait for a step to copy them out."""
        return bool(self._publish)

    def take_saves(self) -> list[UnitSave]:
        saves, self.saves = self.saves, []
        self._pending.clear()
        self._publishing, self._publish = self._publish, set()
        return saves

    def stored(self, units: Sequence[TierUnit]) -> None:
        """The runner copied these units out: they go into the tiers, root first."""
        if not units:
            return
        before = self._keys()
        for unit in units:
            is_published = unit.key in self._publishing
            if not is_published and self.stack.put(unit) is not None:
                self.num_saves += 1
            if self.shared is not None and self.shared.put(unit):
                self.num_published += is_published
                self._announce_stored(unit.key, Record(unit.parent, 0, unit.start, unit.end))
        self._publishing = set()
        self._announce(before)
        stack = self.stack
        held = len(stack.host.units) + (0 if stack.disk is None else len(stack.disk.index))
        if len(self.reasons) > 2 * held + 1024:  # forget the reasons of units no tier holds
            self.reasons = {k: r for k, r in self.reasons.items() if stack.holds(k)}

    # ------------------------------------------------------------------ up
    def find(
        self, hashes: Sequence[BlockHash], num_tokens: int, device_length: int
    ) -> TierPlan | None:
        """The deepest tier hit above `device_length` worth loading, as a `TierPlan`; None
        when there is none. Reads the tiers' indexes only (`read` reads the units)."""
        geometry, unit, stack = self.geometry, self.unit, self.stack
        if (
            geometry.eagle_drop
            or not geometry.enable_prefix_caching
            or not (
                stack.host.units
                or (stack.disk is not None and len(stack.disk.index))
                or self.shared is not None
            )
        ):
            return None
        align = geometry.hit_alignment
        top = min(num_tokens - 1, len(hashes) * unit) // align * align
        if top <= device_length:
            return None
        self._remote = {}
        if self.shared is not None:  # one call: the store's records along the chain
            wanted = [key for key in hashes[: top // unit] if not stack.holds(key)]
            self._remote = self.shared.records(wanted)
        pool = self.coordinator.attention.pool
        device = attention_match(
            pool.entries.get,
            hashes,
            top,
            unit,
            pool.block_size,
            geometry.is_fine_grained,
        )
        is_refused = False
        for position in range(top, device_length, -align):
            key = hashes[position // unit - 1]
            if not stack.holds(key) and key not in self._remote:
                continue
            start = min(device.length, position)
            chain = self._chain(key, start)
            if chain is None:
                continue
            places = {HOST: 0, DISK: 0, SHARED: 0}
            for link, _ in chain:
                places[self._place(link)] += self._bytes(link)
            if self.costs is not None and self.costs.load_seconds(places) > (
                self.costs.prefill_seconds(position - device_length)
            ):
                is_refused = True
                continue
            size = pool.block_size
            blocks = [entry.block_id for entry in device.values][: -(-start // size)]
            return TierPlan(position, start, blocks, [k for k, _ in chain], sum(places.values()))
        self.num_refused_slow += is_refused
        return None

    def _chain(self, key: BlockHash, start: int) -> list[tuple[BlockHash, int]] | None:
        """The units from the one holding `start` up to `key`, root first, with each unit's
        start; None when the chain breaks before reaching `start`."""
        chain = []
        link: BlockHash | None = key
        while link is not None:
            record = self._record(link)
            if record is None:
                return None
            chain.append((link, record.start))
            if record.start <= start:
                return chain[::-1]
            link = record.parent
        return None

    def _record(self, key: BlockHash) -> Record | None:
        record = self.stack.host.index.records.get(key)
        if record is None and self.stack.disk is not None:
            record = self.stack.disk.index.records.get(key)
        if record is None:
            record = self._remote.get(key)
        return record

    def _place(self, key: BlockHash) -> str:
        """The nearest tier holding `key`: this engine's, else the shared store's."""
        if key in self.stack.host:
            return HOST
        return DISK if self.stack.disk is not None and key in self.stack.disk else SHARED

    def _bytes(self, key: BlockHash) -> int:
        """The unit's bytes as its tier records them; 0 once no tier does (a load earlier in
        the same plan made room by giving it up: its own load then fails, and so the plan)."""
        record = self._record(key)
        return 0 if record is None else record.num_bytes

    def read(
        self, plan: TierPlan, request_id: str, device_length: int = 0
    ) -> tuple[list[TierUnit], list[str]] | None:
        """The plan's units, root first, each with the tier it was read from (a unit read from
        disk is promoted into host memory on the way); None when one turned out corrupt (then
        it and the units after it are gone from the tiers). Each tier is credited the hit
        tokens past `device_length` (the device's own hit) up to its units' ends."""
        before = self._keys()
        units, places, sizes = [], [], []
        for key in plan.keys:
            place = self._place(key)
            sizes.append(self._bytes(key))  # what `plan.num_bytes` counted of it
            started = time.perf_counter()
            unit = self.stack.load(key) if place != SHARED else self._load_shared(key)
            self.read_times.setdefault(place, ReadTimes.empty()).add(time.perf_counter() - started)
            if unit is None:
                self._announce(before)
                return None
            units.append(unit)
            places.append(place)
        self._announce(before)
        self.num_loads += 1
        self.num_loaded_bytes += plan.num_bytes
        if SHARED in places:
            self.num_shared_loads += 1
            self.num_shared_loaded_tokens += sum(
                unit.end - max(unit.start, plan.start)
                for unit, place in zip(units, places, strict=True)
                if place == SHARED
            )
        tokens: dict[str, int] = {}
        by_medium: dict[str, int] = {}
        reached = device_length  # the device's own hit is not the tiers'
        for unit, place, size in zip(units, places, sizes, strict=True):
            # root first, so each unit serves the hit tokens from where the last one reached
            # (or the device's own hit) to its end: together, the hit past the device's own
            tokens[place] = tokens.get(place, 0) + max(0, unit.end - reached)
            reached = max(reached, unit.end)
            by_medium[place] = by_medium.get(place, 0) + size
        for place, num in tokens.items():
            self.loaded_tokens_by_medium[place] = self.loaded_tokens_by_medium.get(place, 0) + num
        if self.sink.is_recording:
            self.sink.emit(
                UnitLoaded(
                    request_id=request_id,
                    unit_hashes=[u.key.hex() for u in units],
                    media=places,
                    token_range=(plan.start, plan.length),
                    num_bytes=plan.num_bytes,
                    tokens_by_medium=tokens,
                    bytes_by_medium=by_medium,
                )
            )
        return units, places

    def _load_shared(self, key: BlockHash) -> TierUnit | None:
        """A unit from the shared store, checked against the record the lookup planned with,
        and kept in host memory (a later hit on this engine loads it from there)."""
        record = self._remote.get(key)
        if self.shared is None or record is None:
            return None
        unit = self.shared.get(key, record)
        if unit is not None:
            self.stack.put(unit)
        return unit

    # ------------------------------------------------------------------ events
    def _keys(self) -> tuple[set[BlockHash], set[BlockHash]] | None:
        if not self.sink.is_recording:
            return None
        disk = self.stack.disk
        return set(self.stack.host.units), set() if disk is None else set(disk.index.records)

    def _announce(self, before: tuple[set[BlockHash], set[BlockHash]] | None) -> None:
        """Events for what changed in each tier since `before`: a unit stored in a tier, a unit
        a tier gave up (a move down is both)."""
        if before is None:
            return
        after = self._keys()
        assert after is not None
        for medium, old, new in ((HOST, before[0], after[0]), (DISK, before[1], after[1])):
            for key in new - old:
                record = self._record(key)
                if record is not None:
                    self._announce_stored(key, record, medium)
            for key in old - new:
                for group_idx, group, _ in self._groups():
                    self.sink.emit(
                        BlockRemoved(
                            block_hashes=[key.hex()],
                            group_idx=group_idx,
                            group=group,
                            block_ids=[],
                            medium=medium,
                        )
                    )

    def _announce_stored(self, key: BlockHash, record: Record, medium: str = SHARED) -> None:
        """`BlockStored` in each group for the unit `key`, now in the tier `medium`."""
        if not self.sink.is_recording:
            return
        parent, start, end = record.parent, record.start, record.end
        for group_idx, group, size in self._groups():
            self.sink.emit(
                BlockStored(
                    block_hashes=[key.hex()],
                    parent_block_hash=None if parent is None else parent.hex(),
                    block_size=size,
                    group_idx=group_idx,
                    group=group,
                    block_ids=[],
                    token_range=(start, end),
                    is_partial=end % size != 0,
                    checkpoint_reason=None,
                    medium=medium,
                )
            )

    def _groups(self) -> list[tuple[int, str, int]]:
        coordinator = self.coordinator
        return [
            (0, ATTENTION, coordinator.attention.block_size),
            (1, MAMBA, coordinator.mamba.block_size),
        ]

    # ------------------------------------------------------------------ reading
    def stats(self) -> TieringStats:
        return TieringStats(
            self.num_saves,
            self.num_unbacked,
            self.num_declined,
            self.num_loads,
            self.num_loaded_tokens,
            self.num_loaded_bytes,
            self.num_refused_slow,
            self.stack.stats(),
            self.num_shared_loads,
            self.num_shared_loaded_tokens,
            self.num_published,
            None if self.shared is None else self.shared.stats(),
            dict(self.loaded_tokens_by_medium),
            {place: ReadTimes(list(t.counts), t.total_s) for place, t in self.read_times.items()},
        )

    def check_invariants(self) -> None:
        self.stack.check_invariants()
        entries = self.coordinator.mamba.pool.entries
        for key in self.chains:
            if key not in entries:
                raise InvariantError(f"tiering: chain kept for state {key.hex()} not on device")
        if self.spans.keys() != self.chains.keys():
            raise InvariantError("tiering: the states with spans are not the states with chains")
        owners: dict[BlockHash, set[BlockHash]] = {}
        for state, span in self.spans.items():
            for attention_key in span:
                owners.setdefault(attention_key, set()).add(state)
        if owners != self.owners:
            raise InvariantError("tiering: the owners of attention keys disagree with the spans")
