"""An engine's finished requests (`GET /engines/{id}/requests`), its hit rate and its misses by
reason over time (`/hit-rate`, `/attribution`)."""

from __future__ import annotations

from typing import Literal

from client.types.base import Body

#: Why a request missed tokens it shared (docs/api.md, "Miss attribution").
MissReason = Literal[
    "no_state",
    "in_flight",
    "held_back",
    "evicted",
    "evicted_host",
    "evicted_disk",
    "evicted_shared",
    "not_admitted",
    "restarted",
    "copy_pending",
]


class MatchStopOut(Body):
    """Where the request's hit stopped and why, as the engine saw it at its first admission."""

    reason: Literal["attention_ended", "no_state", "in_flight", "held_back"]
    attention_tokens: int
    limit_tokens: int
    in_flight_tokens: int
    copy_wait_steps: int


class RequestAttribution(Body):
    """Why the request missed what it missed; `pending` (the token counts None) while a request
    that arrived before it still runs."""

    state: Literal["pending", "attributed"]
    shared_tokens: int | None
    oracle_tokens: int | None
    missed_tokens: dict[MissReason, int] | None
    stop_reason: str
    copy_wait_steps: int


class RequestOut(Body):
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
    pin_hits: dict[str, int]
    attention_match_key: str | None
    block_ids: dict[str, list[int | None]]
    arrival_index: int | None = None  # None: recorded before engines reported it
    oldest_unfinished_index: int | None = None
    match_stop: MatchStopOut | None = None
    arrival_step: int | None = None
    checkpoint_offsets: list[int] | None = None
    # its hit by the tier that served it ("device", "host", "disk", "shared") and the bytes
    # read from each tier below the device (None: a control plane before tiers)
    hit_tokens_by_tier: dict[str, int] | None = None
    loaded_bytes_by_tier: dict[str, int] | None = None
    attribution: RequestAttribution | None = None  # None: the engine reported no match stop


class RequestPage(Body):
    engine_id: str
    total: int
    offset: int
    limit: int
    requests: list[RequestOut]


class HitRateTotals(Body):
    """Token totals of finished requests; `hit_rate` is cached / prompt tokens."""

    num_requests: int
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    hit_tokens_by_group: dict[str, int]
    hit_rate: float
    hit_rate_by_group: dict[str, float]
    # hit tokens the tiers below the device served, and the bytes read from each
    hit_tokens_by_tier: dict[str, int] = {}
    loaded_bytes_by_tier: dict[str, int] = {}


class HitRateBucketOut(HitRateTotals, kw_only=True):
    bucket_start: int
    bucket_s: int


class HitRateOut(Body):
    engine_id: str
    since: float | None
    until: float | None
    total: HitRateTotals
    buckets: list[HitRateBucketOut]


class AttributionTotals(Body):
    """Totals of the attributed requests; `num_pending` finished in the same time are not in
    them yet."""

    num_requests: int
    prompt_tokens: int
    hit_tokens: int
    shared_tokens: int
    oracle_tokens: int
    missed_tokens: dict[MissReason, int]
    num_pending: int


class AttributionBucketOut(AttributionTotals):
    bucket_start: int
    bucket_s: int


class AttributionOut(Body):
    engine_id: str
    since: float | None
    until: float | None
    total: AttributionTotals
    buckets: list[AttributionBucketOut]
