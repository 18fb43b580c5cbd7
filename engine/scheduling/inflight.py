"""In-flight sharing: a waiting request whose prefix a request in flight is computing now.

A request that shares a prefix with one being prefilled now would recompute what the other is
about to register. It waits instead (bounded by `max_prefix_wait_steps`), and the producer
keeps the state where the two part, so the waiter hits it; a preempted or aborted producer
leaves `running` and so releases its waiters. A request admitted while siblings that share its
prefix still wait keeps the states where each would stop hitting it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from engine.cache.coordinator import CacheHit, HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.config import CacheConfig, SchedulerConfig
from engine.hashing import num_shared_units
from engine.request import Request

SIBLING_LOOKAHEAD = 64  # waiting requests an admitted one keeps junctions for
JUNCTION_RETENTION = CheckpointReason.JUNCTION.retention


@dataclass
class InflightSharing:
    """Decides who waits for whom; changes only checkpoint targets and wait counts."""

    coordinator: HybridCoordinator
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig

    def shared_hit(self, request: Request, other: Request) -> int:
        """The hit `request` would get if everything it shares with `other` were cached."""
        unit = self.cache_config.match_unit
        shared = num_shared_units(request.block_hashes, other.block_hashes) * unit
        return self.coordinator.reachable_hit(shared, request.num_tokens)

    def in_flight_reach(self, request: Request, running: Iterable[Request]) -> int:
        """How far a prefilling request in flight is computing `request`'s prefix beyond what
        it has registered: the hit `request` would reach by waiting for it (0 when none)."""
        reach = 0
        for producer in running:
            if producer.is_pin or not producer.is_prefilling or producer is request:
                continue
            reachable = self.shared_hit(request, producer)
            if reachable > producer.num_registered_tokens:
                reach = max(reach, reachable)
        return reach

    def waits_for_producer(
        self, request: Request, hit: CacheHit, running: Iterable[Request]
    ) -> bool:
        """Whether `request` should wait for a prefilling request in flight that will register
        more of its prefix than is cached now; that producer then keeps the state there."""
        if (
            request.is_pin
            or not self.cache_config.junction_checkpoints
            or request.num_wait_steps >= self.scheduler_config.max_prefix_wait_steps
        ):
            return False
        waits = False
        for producer in running:
            if producer.is_pin or not producer.is_prefilling:
                continue  # decoding: what it registered is already in the cache
            reachable = self.shared_hit(request, producer)
            if reachable <= hit.length or producer.num_registered_tokens >= reachable:
                continue
            self.keep_junction(producer.targets, reachable)
            waits = True
        if waits:
            request.num_wait_steps += 1
        return waits

    def keep_sibling_junctions(
        self,
        request: Request,
        hit: CacheHit,
        targets: dict[int, CheckpointReason],
        waiting: Iterable[Request],
    ) -> None:
        """A request admitted while others that share its prefix wait keeps the state where
        each would stop hitting it: they arrive together and would otherwise all miss."""
        if request.is_pin or not self.cache_config.junction_checkpoints:
            return
        for sibling in itertools.islice(waiting, SIBLING_LOOKAHEAD):
            if sibling is request or sibling.is_pin:
                continue
            reachable = self.shared_hit(sibling, request)
            if hit.length < reachable < request.num_prompt_tokens:
                self.keep_junction(targets, reachable)

    def keep_junction(self, targets: dict[int, CheckpointReason], position: int) -> None:
        """Add a junction target at `position` (floored to where hits land) unless a reason
        retained as long is there already."""
        cache = self.cache_config
        floor = cache.match_unit if cache.partial_hits else cache.scheduler_block_size
        position = position // floor * floor
        current = targets.get(position)
        if position and (current is None or current.retention < JUNCTION_RETENTION):
            targets[position] = CheckpointReason.JUNCTION
