"""Engine and cache statistics: what `/metrics` and the dashboard read."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.cache.block_pool import BlockPool
from engine.request import Request


@dataclass
class CacheUsage:
    """A group's blocks by state; `cached` are free blocks that still hold entries."""

    num_blocks: int
    num_free: int
    num_cached: int
    num_in_use: int
    num_pinned: int

    @property
    def usage(self) -> float:
        """The share of blocks a new request could not take without evicting."""
        return (self.num_in_use + self.num_pinned) / self.num_blocks if self.num_blocks else 0.0


def cache_usage(pool: BlockPool) -> CacheUsage:
    num_pinned = pool.num_pinned
    num_free_total = pool.num_free
    num_cached = sum(1 for b in pool.blocks if b.free_queue is not None and b.keys)
    return CacheUsage(
        num_blocks=pool.num_blocks,
        num_free=num_free_total - num_cached,
        num_cached=num_cached,
        num_in_use=pool.num_blocks - num_free_total - num_pinned,
        num_pinned=num_pinned,
    )


RECENT_TTFTS = 4096


@dataclass
class EngineStats:
    """Totals since the engine started. Queries are prompt tokens looked up; hits are the
    tokens a group served from the cache (`attention`: its match, `mamba`: the hit length)."""

    started_ts: float = field(default_factory=time.time)
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    hit_tokens_by_group: dict[str, int] = field(default_factory=dict)
    # the most recent TTFTs only: an engine that lives for months keeps a bounded window
    ttft_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_TTFTS))

    def record(self, request: Request) -> None:
        self.num_requests += 1
        self.num_prompt_tokens += request.num_prompt_tokens
        self.num_cached_tokens += request.num_cached_tokens or 0
        self.num_computed_tokens += request.num_prefill_computed
        self.num_generated_tokens += len(request.output_token_ids)
        self.num_preemptions += request.num_preemptions
        for group, hit in request.hit_tokens_by_group.items():
            self.hit_tokens_by_group[group] = self.hit_tokens_by_group.get(group, 0) + hit
        if request.ttft_s is not None:
            self.ttft_s.append(request.ttft_s)

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def tokens_per_s(self, now: float | None = None) -> float:
        elapsed = (now or time.time()) - self.started_ts
        return self.num_generated_tokens / elapsed if elapsed > 0 else 0.0
