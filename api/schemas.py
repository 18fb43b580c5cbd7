"""Request and response bodies of the REST API (pydantic), apart from the ORM models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)

from engine.geometry import CacheGeometry
from engine.model.tokenizer import ByteTokenizer, render_messages
from engine.traces.trace import MAX_TOKEN_ID, Segment, segment_tokens
from engine.wire import ENGINE_ID_PATTERN
from workloads.misses import MissReason

EngineId = Annotated[str, Field(min_length=1, max_length=128, pattern=ENGINE_ID_PATTERN)]
#: The longest prefix a pin may take (an engine's own `max_model_len` may be lower).
MAX_PIN_TOKENS = 1 << 20
#: The most engines a pin may name.
MAX_PIN_ENGINES = 1000


def _inlined_schema(struct: type) -> dict:
    """A msgspec struct's JSON Schema with its `$defs` written in place (OpenAPI has no
    `$defs` of its own)."""
    schema = msgspec.json.schema(struct)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return inline(schema)


#: An engine's hello geometry in a REST body: the struct itself (`engine.geometry`), read with
#: `CacheGeometry.from_json` and written as its JSON (the fields the engine did not report left
#: out), its schema msgspec's.
CacheGeometryBody = Annotated[
    CacheGeometry,
    PlainValidator(CacheGeometry.from_json),
    PlainSerializer(CacheGeometry.to_json, return_type=dict),
    WithJsonSchema(_inlined_schema(CacheGeometry)),
]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class EngineOut(_Out):
    engine_id: str
    epoch: int
    next_seq: int
    connected: bool
    # the replica that holds its socket (`api.fleet.replicas`); None while it is not connected
    replica_id: str | None
    first_seen: datetime
    last_seen: datetime
    geometry: CacheGeometryBody  # what its last hello said of its cache (`CacheGeometry`)
    model: dict[str, Any]
    num_batches_dropped: int  # event batches its outbox gave up for a snapshot (this epoch)
    num_requests_dropped: int  # finished requests it gave up: past its outbox's limits
    last_drop: str | None  # why, the last time it gave up requests


class ReplicaOut(BaseModel):
    """A live `junction api` process of this store (`api.fleet.replicas`)."""

    replica_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    num_engines: int  # the connected engines whose sockets it holds
    is_self: bool  # the replica that answered this request


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
    tier: str = "device"  # where the block lives: a block-table row is the device's


class BlockPage(BaseModel):
    engine_id: str
    total: int
    offset: int
    limit: int
    blocks: list[BlockOut]
    # why the page is empty: an engine without physical block ids (`/peer-blocks` has its cache)
    note: str | None = None


class PeerBlockOut(BaseModel):
    """A block of an engine without physical block ids (`api.store.models.PeerBlock`): `parent` is
    the hash before it in its chain (null at a root), `token_sample` its first token ids,
    `stored_at` the Unix seconds of the batch that stored it last."""

    rank: int
    group: str
    group_idx: int
    medium: str
    tier: str  # where it lives: "device", "host", "disk", "shared" (else the medium's name)
    hash: str
    parent: str | None
    num_tokens: int
    token_sample: list[int]
    stored_at: float


class PeerBlockPage(BaseModel):
    total: int
    blocks: list[PeerBlockOut]


class PeerChurnOut(BaseModel):
    """Blocks stored and removed (a clear's included) in the bucket starting at `ts`."""

    ts: float
    rank: int
    group: str
    medium: str
    stored: int
    removed: int


class PeerMetricOut(BaseModel):
    """One scrape of the peer's counters: cumulative prefix-cache tokens, usage in 0..1."""

    ts: float
    rank: int
    queries_tokens: float
    hits_tokens: float
    usage: float | None


class PeerResyncOut(BaseModel):
    """A gap the bridge could not fill (or, `reason` "store full: ...", new blocks the store
    refused for its cap; then the seqs are the wire's batches)."""

    ts: float
    rank: int
    first_missing_seq: int
    resumed_seq: int
    reason: str


class PeerSummary(BaseModel):
    """An engine's hash-keyed cache at a glance: `kind` the peer's ("vllm", "sglang"; "junction"
    for an engine with physical block ids, whose other fields are then empty), blocks held by
    group and medium (every rank's), its ranks, and its churn, metric samples and resyncs of
    the last `window_s` seconds, oldest first. `hit_rate` is the hits over the queries the
    samples' counters added in the window (null without any query)."""

    kind: str
    groups: dict[str, dict[str, int]]
    tiers: dict[str, dict[str, int]]  # the same blocks by group then tier (device, host, ...)
    ranks: list[int]
    churn: list[PeerChurnOut]
    metrics: list[PeerMetricOut]
    hit_rate: float | None
    resyncs: list[PeerResyncOut]


class MatchStopOut(BaseModel):
    """Where the request's hit stopped and why, as the engine saw it at its first admission
    (`RequestFinished.match_stop`, docs/events.md)."""

    reason: Literal["attention_ended", "no_state", "in_flight", "held_back"]
    attention_tokens: int
    limit_tokens: int
    in_flight_tokens: int
    copy_wait_steps: int


class RequestAttribution(BaseModel):
    """Why the request missed what it missed (docs/api.md, "Miss attribution"). `pending`
    while a request that arrived before it is still running: then `shared_tokens`,
    `oracle_tokens` and `missed_tokens` are null. Attributed: `shared_tokens` is the prefix it
    truly shared with an earlier request or a pin (the online oracle), `oracle_tokens` the hit
    an unlimited cache would give, and `missed_tokens` every reason's share of
    `max(shared_tokens, hit) - hit`. `stop_reason` and `copy_wait_steps` are the engine's."""

    state: Literal["pending", "attributed"]
    shared_tokens: int | None
    oracle_tokens: int | None
    missed_tokens: dict[MissReason, int] | None
    stop_reason: str
    copy_wait_steps: int


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
    pin_hits: dict[str, int]
    attention_match_key: str | None
    # no `junction_token_ids`: a prompt's tokens are returned only where they are needed, by
    # the suggested junctions (to pin one), never with a request or in the event log; no
    # `unit_hashes` either: the store keeps only salted hashes, and never serves them
    block_ids: dict[str, list[int | None]]
    arrival_index: int | None = None  # null: recorded before engines reported it
    oldest_unfinished_index: int | None = None
    match_stop: MatchStopOut | None = None
    # the engine's step count when it arrived, and where its chat messages ended (what a
    # what-if replays it with; null: recorded before engines reported them)
    arrival_step: int | None = None
    checkpoint_offsets: list[int] | None = None
    # its hit by the tier that served it ("device", "host", "disk", "shared"; the device alone
    # when nothing was loaded) and the bytes read from each tier below the device
    hit_tokens_by_tier: dict[str, int] | None = None
    loaded_bytes_by_tier: dict[str, int] | None = None
    attribution: RequestAttribution | None = None  # null: the engine reported no match stop


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
    # the hit tokens the tiers below the device served ("host", "disk", "shared"; the device's
    # are `cached_tokens` less these) and the bytes read from each, by the batch that loaded them
    hit_tokens_by_tier: dict[str, int] = {}
    loaded_bytes_by_tier: dict[str, int] = {}


class HitRateBucketOut(HitRateTotals):
    bucket_start: int
    bucket_s: int


class HitRateOut(BaseModel):
    engine_id: str
    since: float | None
    until: float | None
    total: HitRateTotals
    buckets: list[HitRateBucketOut]


class AttributionTotals(BaseModel):
    """Totals of the attributed requests (by `finished_ts`, as the hit rate's): their prompt
    tokens, hits, shared prefixes (the online oracle's shared length), oracle hits and missed
    tokens by reason. `num_pending` requests finished in the same time are not in them yet."""

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


class AttributionOut(BaseModel):
    engine_id: str
    since: float | None
    until: float | None
    total: AttributionTotals
    buckets: list[AttributionBucketOut]


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


# ---------------------------------------------------------------------------- pins
# The lists of a pin's body stop at their first bad item (`fail_fast`): a million bad token ids
# are one error, not a million, each a dict to build and answer.
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
# `PinPrefix._one_form` refuses an empty form, naming it; the schema says so with its minimum.
NOT_EMPTY = Field(json_schema_extra={"minItems": 1})
PinTokenIds = Annotated[list[TokenId], Field(max_length=MAX_PIN_TOKENS, fail_fast=True), NOT_EMPTY]
PinSegments = Annotated[list[Segment], Field(max_length=MAX_PIN_TOKENS, fail_fast=True), NOT_EMPTY]
PREFIX_FORMS = ("text", "token_ids", "segments", "messages")
#: `_one_form` in the schema: exactly one form is given and not null (a null one counts as
#: left out). That the prefix holds at most `MAX_PIN_TOKENS` tokens (UTF-8 bytes of `text`,
#: the sum of the segments' lengths) the schema cannot say: a 422 does.
ONE_PREFIX_FORM = {
    "oneOf": [
        {"required": [form], "properties": {form: {"not": {"type": "null"}}}}
        for form in PREFIX_FORMS
    ]
}


class PinMessage(BaseModel):
    """A chat message of a pinned prefix (a system prompt): `role` and its text."""

    model_config = ConfigDict(extra="forbid")
    role: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    content: str


class PinPrefix(BaseModel):
    """A pin's prefix in exactly one form: `text` (each engine tokenizes it as its server
    tokenizes a prompt; for the built-in model its UTF-8 bytes are the tokens), `token_ids`,
    `segments` (a replay trace's seeded segments: the same seed and length always give the
    same tokens), or `messages` (chat messages: each engine renders them with its chat
    template, the prefix ending where the last given message ends, so a chat request that
    starts with them hits it)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=ONE_PREFIX_FORM)
    text: Annotated[str, Field(json_schema_extra={"minLength": 1})] | None = None
    token_ids: PinTokenIds | None = None
    segments: PinSegments | None = None
    messages: Annotated[list[PinMessage], Field(min_length=1, fail_fast=True)] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> PinPrefix:
        given = [name for name in PREFIX_FORMS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give the prefix in exactly one form: text, token_ids, segments or messages "
                f"(got {', '.join(given) or 'none'})"
            )
        num_tokens = self.num_tokens()  # counted before any tokens are made
        if num_tokens == 0:
            raise ValueError(f"the prefix is empty ({given[0]} has no tokens)")
        if num_tokens > MAX_PIN_TOKENS:
            raise ValueError(f"the prefix has {num_tokens} tokens; at most {MAX_PIN_TOKENS}")
        return self

    def num_tokens(self) -> int:
        if self.text is not None:
            return len(self.text.encode("utf-8"))
        if self.messages is not None:
            return len(self.rendered().encode("utf-8"))
        if self.segments is not None:
            return sum(segment.len for segment in self.segments)
        return len(self.token_ids or [])

    def rendered(self) -> str:
        """The messages as the engines' chat template renders them (`render_messages`: no
        assistant header after them); the byte tokenizer reads the UTF-8 bytes as tokens."""
        return render_messages(m.model_dump() for m in self.messages or [])

    def source(self) -> dict | None:
        """The text or messages as a pin command carries them, for each engine to tokenize
        (`None` for token ids and segments, which every engine reads alike)."""
        if self.text is not None:
            return {"text": self.text}
        if self.messages is not None:
            return {"messages": [m.model_dump() for m in self.messages]}
        return None

    def tokens(self) -> list[int]:
        if self.text is not None:
            return ByteTokenizer().encode(self.text)
        if self.messages is not None:
            return ByteTokenizer().encode(self.rendered())
        if self.segments is not None:
            return [t for s in self.segments for t in segment_tokens(s.seed, s.len)]
        return list(self.token_ids or [])


class PinCreate(BaseModel):
    """`POST /pins`: `engine_ids` left out targets every engine, connected now or later."""

    model_config = ConfigDict(extra="forbid")
    prefix: PinPrefix
    label: Annotated[str, Field(min_length=1, max_length=200)]
    engine_ids: (
        Annotated[list[EngineId], Field(min_length=1, max_length=MAX_PIN_ENGINES, fail_fast=True)]
        | None
    ) = None
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0


class PinTargetOut(_Out):
    """One engine's side of a pin: `boundary` is the prefix floored to that engine's hit grid
    (null: its geometry gives none); `state` pending, materialized, failed (`reason` says why)
    or released; `num_hits` requests hit the pin there, saving `tokens_saved` tokens."""

    engine_id: str
    state: str
    boundary: int | None
    reason: str | None
    keys: dict[str, str]
    block_ids: dict[str, list[int]]
    num_hits: int
    tokens_saved: int
    updated_at: datetime


class PinOut(BaseModel):
    """A pin. `state` is released once released; else pending while an engine is (or none is
    targeted yet), failed when every engine failed, materialized otherwise. `targets` is
    "all" (every engine, connected now or later) or the engine ids; `origin` "engine": a pin
    an engine reported that the API never made (a replay trace's)."""

    pin_id: str
    label: str
    origin: Literal["api", "engine"]
    num_tokens: int
    priority: int
    targets: Literal["all"] | list[str]
    state: Literal["pending", "materialized", "failed", "released"]
    boundary: dict[str, int | None]
    engines: list[PinTargetOut]
    num_hits: int
    tokens_saved: int
    created_at: datetime
    released_at: datetime | None


class PinDetail(PinOut):
    """A pin with `source`: the prefix as given when it was `{"text": ...}` or
    `{"messages": [...]}`, which each engine tokenizes itself (null for token ids, segments, or
    an engine's pin); and its tokens when asked for (`?tokens=true`; null for an engine's
    pin)."""

    token_ids: list[int] | None
    source: dict[str, Any] | None


# ---------------------------------------------------------------------------- junctions
class JunctionPinRequest(BaseModel):
    """A ready `POST /pins` body."""

    prefix: dict[str, list[int]]
    label: str


class JunctionOut(BaseModel):
    """A position many requests' attention matches reached and no checkpoint covered: `key`
    is `H_boundary`; `tokens_saved` what a pin there would have saved them (the tokens they
    recomputed because their Mamba hit fell short of it)."""

    key: str
    boundary: int
    num_requests: int
    num_short_requests: int
    tokens_saved: int
    engine_ids: list[str]
    pin_request: JunctionPinRequest


class JunctionPage(BaseModel):
    engine_id: str | None
    limit: int
    junctions: list[JunctionOut]


# ---------------------------------------------------------------------------- benchmarks
RunStatus = Literal["queued", "running", "finished", "failed"]


class BenchmarkRunOut(_Out):
    """A benchmark run. `spec` is the `BenchmarkSpec` it replays (defaults filled in);
    `progress` 0..1 with the worker's last `progress_message`; `error` says why a failed run
    failed; `attempts` counts its starts; `results` (once finished) are `run_benchmark`'s:
    `{"modes": [...], "oracle": {...}, "workload": {...}}`."""

    id: int
    name: str
    status: RunStatus
    spec: dict[str, Any]
    progress: float
    progress_message: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    attempts: int
    task_id: str | None
    worker: str | None
    results: dict[str, Any] | None


class BenchmarkRunPage(BaseModel):
    total: int
    offset: int
    limit: int
    runs: list[BenchmarkRunOut]


# ---------------------------------------------------------------------------- dead letters
class DeadLetterOut(_Out):
    """A frame the store refused, parked so the engine's stream went on: its seq counted as
    applied, its events were not. `frame` is the frame as JSON (a msgpack frame re-encoded),
    its first `JUNCTION_DEAD_LETTER_FRAME_BYTES` bytes; `frame_bytes` its whole length."""

    id: int
    engine_id: str
    epoch: int
    seq: int
    frame_type: str
    received_at: datetime
    reason: str
    frame: str
    frame_bytes: int


class DeadLetterPage(BaseModel):
    engine_id: str
    total: int
    offset: int
    limit: int
    dead_letters: list[DeadLetterOut]


# ---------------------------------------------------------------------------- what-if
#: The most settings one what-if run tries.
MAX_WHATIF_SETTINGS = 32
WhatIfStatus = Literal["queued", "running", "done", "failed"]


class WhatIfBody(BaseModel):
    """`POST /engines/{engine_id}/whatif`: the settings to try (each an
    `whatif.settings.WhatIfSetting`: the fields it changes from what the engine ran
    with, `{}` replays what ran) over one epoch's recorded requests (default: the newest)."""

    model_config = ConfigDict(extra="forbid")

    settings: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=MAX_WHATIF_SETTINGS)]
    epoch: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None


class WhatIfRunOut(_Out):
    """A what-if run: `progress_done` of `progress_total` requests replayed (each setting's
    replays counted); `result` (once done) the report: `num_requests`, `num_prompt_tokens`,
    `recorded_tokens` (the hits the engine reported), `agreement` (the requests whose replay
    with the engine's own settings hit what they recorded), `exact`, `as_ran` and `results`
    (one per setting, most tokens saved first: `label`, `changes`, `config`, `hit_tokens`,
    `oracle_tokens`, `bound_tokens`, `hit_rate`, `share_of_oracle`, `share_of_bound`,
    `gain_tokens`); `error` why a failed run failed."""

    id: int
    engine_id: str
    epoch: int
    status: WhatIfStatus
    settings: list[dict[str, Any]]
    progress_done: int
    progress_total: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    attempts: int
    worker: str | None
    result: dict[str, Any] | None


class WhatIfRunPage(BaseModel):
    total: int
    offset: int
    limit: int
    runs: list[WhatIfRunOut]


class TierUnitOut(BaseModel):
    """A usable-hit unit in a tier below the device (`api.store.models.TierUnit`): its key
    `H_end` and its parent's (null at the root), the tokens `[start, end)` whose attention it
    carries with the state at `end`, and when (Unix seconds) the tier took it."""

    tier: str
    key: str
    parent: str | None
    token_range: tuple[int, int]
    stored_at: float


class TierUsage(BaseModel):
    """What one tier holds now: units, the tokens of attention they carry, and the bytes it may
    hold (the engine's hello; null when it does not say)."""

    num_units: int
    num_tokens: int
    capacity_bytes: int | None


class TierPage(BaseModel):
    """An engine's tiers below the device (docs/api.md, "Tiers"): each tier's usage (every tier
    the engine has, and any the store holds units of), and a page of the units held now, by
    tier then token range; `tier` filters the page."""

    engine_id: str
    tiers: dict[str, TierUsage]
    total: int
    offset: int
    limit: int
    units: list[TierUnitOut]
