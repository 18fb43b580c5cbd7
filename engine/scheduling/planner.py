"""A request's chunk plan for one step: where its chunk ends, the Mamba states it writes, and
at admission the checkpoint targets it keeps (docs/rules.md sections 5 and 6), from the pure
functions of `engine.scheduling.chunking` over the engine's configs. Changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from engine.cache.entry import CheckpointReason
from engine.config import CacheConfig, SchedulerConfig
from engine.pins import PinManager
from engine.request import Request
from engine.scheduling.chunking import Chunk, checkpoint_targets, plan_chunk, state_positions

DECODE = "decode"  # the stop reason of a decode step's one-token chunk


@dataclass
class ChunkPlanner:
    cache: CacheConfig
    config: SchedulerConfig
    pins: PinManager

    def plan(self, request: Request, start: int, budget: int) -> Chunk | None:
        """The chunk from `start` within `budget` tokens; None when it must wait for a step
        with more budget."""
        if not request.is_prefilling or start >= request.prefill_target:
            return Chunk(request.num_tokens, DECODE)
        config, cache = self.config, self.cache
        return plan_chunk(
            start,
            min(budget, config.chunk_limit),
            request.num_tokens,
            cache.scheduler_block_size,
            config.chunk_limit,
            cache.eagle and not request.is_pin,
            request.targets,
            stops_at_checkpoints=cache.checkpoint_mode == "stops",
        )

    def positions(self, request: Request, start: int, end: int) -> list[int]:
        """The Mamba states the chunk `[start, end)` writes."""
        return state_positions(
            start,
            end,
            self.cache.mamba_block_size,
            request.targets,
            inline=self.cache.checkpoint_mode == "inline",
            refused=request.refused_states,
        )

    def targets(
        self, request: Request, junction: int | None, branch: int | None = None
    ) -> dict[int, CheckpointReason]:
        """The positions the request keeps a state at, and why; `branch` is where its prompt
        parted from earlier ones, as the eviction policy learnt it (before the EAGLE drop)."""
        cache = self.cache
        return checkpoint_targets(
            request.num_prompt_tokens,
            cache.match_unit,
            cache.scheduler_block_size,
            cache.eagle,
            cache.partial_hits,
            junction,
            self.pins.boundaries(request),
            request.checkpoint_offsets,
            None if branch is None else branch - cache.eagle_drop,
        )
