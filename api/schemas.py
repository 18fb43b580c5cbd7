"""Response bodies of the REST API (pydantic), apart from the ORM models they are read from."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class EngineOut(_Out):
    engine_id: str
    epoch: int
    next_seq: int
    connected: bool
    first_seen: datetime
    last_seen: datetime
    geometry: dict[str, Any]
    model: dict[str, Any]


class GroupUsage(BaseModel):
    """A group's blocks by state, counted from the store's rows. `num_blocks` is the pool's
    size when the hello's geometry gives it (`groups.<group>.num_blocks`; blocks never reported
    are free), else the number of rows."""

    num_blocks: int
    num_free: int
    num_cached: int
    num_in_use: int
    num_pinned: int
    usage: float


class EngineDetail(EngineOut):
    cache: dict[str, GroupUsage]
    num_requests: int


class BlockOut(BaseModel):
    """A row in `BlockPool.row`'s shape; `token_range` is `[start, end)` or null."""

    group: str
    block_id: int
    state: str
    keys: list[str]
    token_range: tuple[int | None, int] | None
    is_partial: bool
    checkpoint_reason: str | None
    ref_cnt: int
    pinned: bool
    last_change: int


class BlockPage(BaseModel):
    engine_id: str
    total: int
    offset: int
    limit: int
    blocks: list[BlockOut]


class RequestOut(_Out):
    engine_id: str
    epoch: int
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    hit_tokens_by_group: dict[str, int]
    num_computed_tokens: int
    num_output_tokens: int
    chunks: list[tuple[int, int]]
    chunk_stop_reasons: list[str]
    checkpoints: list[int]
    num_preemptions: int
    finish_reason: str
    arrival_ts: float
    first_token_ts: float | None
    finished_ts: float
    ttft_s: float | None


class RequestPage(BaseModel):
    engine_id: str
    total: int
    offset: int
    limit: int
    requests: list[RequestOut]


class HitRateTotals(BaseModel):
    """Token totals of finished requests; `hit_rate` is cached / prompt tokens, and
    `hit_rate_by_group` each group's hit tokens over prompt tokens (0 with no prompt tokens)."""

    num_requests: int
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    hit_tokens_by_group: dict[str, int]
    hit_rate: float
    hit_rate_by_group: dict[str, float]


class HitRateBucketOut(HitRateTotals):
    bucket_start: int
    bucket_s: int


class HitRateOut(BaseModel):
    engine_id: str
    since: float | None
    until: float | None
    total: HitRateTotals
    buckets: list[HitRateBucketOut]


class BatchOut(_Out):
    engine_id: str
    epoch: int
    seq: int
    ts: float
    received_at: datetime
    num_events: int
    events: list[dict[str, Any]]


class EventPage(BaseModel):
    """Batches with `seq > after_seq`, in their engines' current epochs unless `epoch` is
    given; `next_after_seq` is the last seq returned (pass it back for the next page)."""

    engine_id: str | None
    epoch: int | None
    after_seq: int
    limit: int
    next_after_seq: int
    batches: list[BatchOut]


class Health(BaseModel):
    status: str
    database: str
