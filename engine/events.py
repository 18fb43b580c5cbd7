"""Cache events: the records the pool and scheduler emit into a sink, declared once.

Names and fields follow vLLM's KV events where they overlap (`BlockStored`, `BlockRemoved`,
`AllBlocksCleared`); the rest is what a hybrid cache needs (block ids, token ranges, partial
entries, checkpoint reasons, copies, moves, per-block state, finished requests, pins).

Each event is a msgspec `Struct` (as vLLM's KV events are), the one declaration the engine, the
publisher and the control plane share: building one checks nothing (the engine's hot path),
encoding it to JSON or msgpack writes `{"type": <class name>, <field>: ...}`, and decoding it
(`engine.wire.decode`) checks every constraint below. `engine.wire` batches them into
`{"engine_id", "epoch", "seq", "ts", "events"}` frames.

The constraints are what the control plane's store can hold, checked at its edge before any
of it reaches the database: ids (`Id`) are 1-256 characters with no control character; every
other string (`Text`) holds no NUL and no lone surrogate; integers fit the column that keeps
them (`Int`, `Count`: signed 64 bits; `Int32`, `Count32`: an `Integer` column's 32); floats
(`Finite`) are finite (NaN fails `ge`, an infinity `le`). Nesting is bounded by the types
themselves: a typed field refuses the first level that is not its shape.
"""

from __future__ import annotations

import sys
from typing import Annotated, ClassVar, Literal, Protocol, get_args

from msgspec import Meta, Struct, structs

INT32_MAX, INT64_MAX = (1 << 31) - 1, (1 << 63) - 1
MAX_ID_LENGTH = 256  # request and pin ids: the store indexes them (a btree row holds ~2.7 KB)
MAX_TEXT_LENGTH = 4096
ID_PATTERN = r"\A[^\x00-\x1f\x7f-\x9f\ud800-\udfff]+\Z"  # no control character, no surrogate
TEXT_PATTERN = r"\A[^\x00\ud800-\udfff]*\Z"  # no NUL (PostgreSQL's text cannot), no surrogate
HEX_PATTERN = r"\A[0-9a-f]+\Z"

Hex = Annotated[str, Meta(pattern=HEX_PATTERN, max_length=128)]
Id = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_LENGTH, pattern=TEXT_PATTERN)]
Int = Annotated[int, Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]
Int32 = Annotated[int, Meta(ge=-INT32_MAX - 1, le=INT32_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
Count32 = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Finite = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
# the cache groups by name, declared once here: the attention KV and the recurrent states
Group = Literal["attention", "mamba"]
Reason = Literal["interval", "block", "resend", "extension", "junction", "pin", "message"]
BlockState = Literal["free", "cached", "in_use", "pinned"]
PinState = Literal["pending", "materialized", "failed", "released"]
# why a request's hit stopped where it did (`MatchStop.reason`; docs/rules.md, miss attribution)
StopReason = Literal["attention_ended", "no_state", "in_flight", "held_back"]
GROUPS: tuple[str, ...] = get_args(Group)
ATTENTION, MAMBA = GROUPS
REASONS: tuple[str, ...] = get_args(Reason)
BLOCK_STATES: tuple[str, ...] = get_args(BlockState)
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
UNIT_HASH_BYTES = 8  # `unit_hashes`: the first 8 bytes of each chained unit hash
MAX_UNIT_HASHES = 1 << 17  # a 2M-token sequence at U 16
# a sequence's chained unit hashes `H_U, H_2U, ...`, each cut to its first 8 bytes, in hex
UnitHashes = Annotated[
    str,
    Meta(pattern=r"\A(?:[0-9a-f]{16})*\Z", max_length=2 * UNIT_HASH_BYTES * MAX_UNIT_HASHES),
]


class EventSink(Protocol):
    """Where the engine's events go. `is_recording` False tells emitters to skip building them
    (and the block-table rows behind `BlockStateChanged`): an engine with no one listening pays
    nothing for events. It is read once, when the engine is built."""

    is_recording: bool

    def emit(self, event: CacheEvent) -> None: ...


class ListSink:
    """Collects events in order; the embedded default and what tests read."""

    is_recording = True

    def __init__(self) -> None:
        self.events: list[CacheEvent] = []

    def emit(self, event: CacheEvent) -> None:
        self.events.append(event)

    def drain(self) -> list[CacheEvent]:
        events, self.events = self.events, []
        return events


class NullSink:
    """Drops everything; emitters that see `is_recording` False do not even build events."""

    is_recording = False

    def emit(self, event: CacheEvent) -> None:
        return None


class BlockRow(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One block-table row: what `BlockPool.row` builds (as a dict of these keys, which the
    engine's snapshot serves as JSON), `BlockStateChanged` and snapshots carry, and the store
    keeps. `token_range` is `[start, end)` of the block's valid tokens, null with no entry."""

    group: Group
    block_id: Count32
    state: BlockState
    keys: list[Hex]
    token_range: tuple[Int | None, Int] | None
    is_partial: bool
    checkpoint_reason: Reason | None
    ref_cnt: Count32
    pinned: bool
    last_change: Count


# `gc=False`: an event holds only strings, numbers and containers of them, never a cycle.
class CacheEvent(
    Struct, frozen=True, tag_field="type", tag=True, forbid_unknown_fields=True, gc=False
):
    type: ClassVar[str] = "CacheEvent"  # the wire tag: the class's name

    def to_dict(self) -> dict:
        """The event as a plain dict. Shallow: nested rows and lists are shared, not copied."""
        return {"type": self.type, **structs.asdict(self)}


class BlockStored(CacheEvent):
    """Keys registered on one block. `token_range` is `[block start, last valid position)`."""

    type: ClassVar[str] = "BlockStored"
    block_hashes: list[Hex]
    parent_block_hash: Hex | None
    block_size: Int
    group_idx: Int
    group: Group
    block_ids: list[Int]
    token_range: tuple[Int, Int]
    is_partial: bool
    checkpoint_reason: Reason | None
    medium: Text = "GPU"
    lora_id: Int | None = None


#: the media of the tiers below the device (`engine.tiers`; "shared": the fleet-wide store): a
#: `BlockStored` or `BlockRemoved` carrying one of these is about a tier, never a device block,
#: and names no block id
TIER_MEDIA = frozenset({"host", "disk", "shared"})
#: where a block lives, fastest first: the views name every medium by one of these
DEVICE, HOST, DISK, SHARED = TIERS = ("device", "host", "disk", "shared")
BELOW_DEVICE = TIERS[1:]
# a bridged engine's medium (vLLM's "GPU", "CPU", an offloading connector's own names) by the
# words it holds: checked in this order, case aside
_TIER_WORDS = (
    (SHARED, ("SHARED", "REMOTE", "REDIS", "VALKEY", "MOONCAKE", "LMCACHE_SERVER", "S3")),
    (DISK, ("DISK", "STORAGE", "FILE", "SSD", "NVME", "GDS", "LOCAL_FS")),
    (HOST, ("HOST", "CPU", "DRAM", "RAM", "PINNED")),
    (DEVICE, ("GPU", "DEVICE", "CUDA", "HBM", "XPU", "TPU", "HPU", "NPU")),
)


def tier_of_medium(medium: str | None) -> str | None:
    """The tier a bridged engine's medium names (vLLM's "GPU", "CPU", a connector's disk);
    None for a name no word of `_TIER_WORDS` is in; no medium (an older peer): the device. A
    Junction engine's own media need no reading: "host", "disk" and "shared" are its tiers and
    anything else its device (whose medium says "CPU" when it runs on the CPU)."""
    if medium is None:
        return DEVICE
    if medium in TIERS:
        return medium
    name = medium.upper()
    for tier, words in _TIER_WORDS:
        if any(word in name for word in words):
            return tier
    return None


class BlockRemoved(CacheEvent):
    type: ClassVar[str] = "BlockRemoved"
    block_hashes: list[Hex]
    group_idx: Int
    group: Group
    block_ids: list[Int]
    medium: Text = "GPU"


class UnitLoaded(CacheEvent):
    """A request's hit was read from the tiers below the device (docs/rules.md section 16):
    the units `unit_hashes` (root first, each from the tier in `media`: "host", "disk" or
    "shared") were written into its device blocks over `token_range`, `num_bytes` in all, of
    which `bytes_by_medium` says each tier's part; `tokens_by_medium` the hit tokens past the
    device's own hit each tier's units served (empty from an engine before them). The
    device's `BlockStored` events for those blocks follow when the step registers them."""

    type: ClassVar[str] = "UnitLoaded"
    request_id: Text
    unit_hashes: list[Hex]
    media: list[Text]
    token_range: tuple[Int, Int]
    num_bytes: Int
    tokens_by_medium: dict[Text, Count] = {}
    bytes_by_medium: dict[Text, Count] = {}


class AllBlocksCleared(CacheEvent):
    type: ClassVar[str] = "AllBlocksCleared"
    group_idx: Int | None = None
    group: Group | None = None


class BlockCopied(CacheEvent):
    """A copy queued for the step `step`: `consumer` (shared -> private) or `producer`."""

    type: ClassVar[str] = "BlockCopied"
    group_idx: Int
    group: Group
    src_block_id: Int
    dst_block_id: Int
    path: Literal["consumer", "producer"]
    request_id: Id
    position: Int
    step: Int


class BlockHashesMoved(CacheEvent):
    type: ClassVar[str] = "BlockHashesMoved"
    group_idx: Int
    group: Group
    block_hashes: list[Hex]
    src_block_id: Int
    dst_block_id: Int


class BlockStateChanged(CacheEvent):
    """The blocks of one group that changed in a step, each as its whole block-table row, so a
    store that applies these rows holds the engine's table. The engine hands `BlockPool.row`'s
    dicts (encoded as they are); decoding gives `BlockRow`s."""

    type: ClassVar[str] = "BlockStateChanged"
    group_idx: Int
    group: Group
    blocks: list[BlockRow]
    step: Int


class MatchStop(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Where a request's hit stopped and why, as the engine saw it at the request's first
    admission; the control plane splits the tokens it missed by these (docs/rules.md).

    The hit (`num_cached_tokens`) is at most the attention match after the EAGLE drop
    (`hit_tokens_by_group["attention"]`), which is at most `attention_tokens`, which is at most
    `limit_tokens`."""

    reason: StopReason
    attention_tokens: Count32  # the attention match before the EAGLE drop (its proof)
    limit_tokens: Count32  # the most that proof could reach: P - 1 (+ U with EAGLE), floored to U
    in_flight_tokens: Count32 = 0  # how far a request in flight was computing this prefix
    copy_wait_steps: Count32 = 0  # steps it waited for a checkpoint's copy instead of missing it


class RequestFinished(CacheEvent):
    """A request ended. The counts are 32-bit (`Integer` columns of `requests`)."""

    type: ClassVar[str] = "RequestFinished"
    request_id: Id
    num_prompt_tokens: Int32
    num_cached_tokens: Int32
    hit_tokens_by_group: dict[Text, Int]
    num_computed_tokens: Int32
    num_output_tokens: Int32
    chunks: list[tuple[Int, Int]]
    chunk_stop_reasons: list[Text]
    checkpoints: list[Int]
    num_preemptions: Int32
    finish_reason: Text
    arrival_ts: Finite
    first_token_ts: Finite | None
    finished_ts: Finite
    ttft_s: Finite | None
    pin_hits: dict[Id, Int] = {}
    attention_match_key: Hex | None = None
    junction_token_ids: list[Int] | None = None
    # each group's block table when the request finished (`None`: a Mamba slot kept no state)
    block_ids: dict[Text, list[Int | None]] = {}
    # miss attribution: the order requests arrived in, this epoch (pins' prefills included),
    # and the first index still in the engine after this one finished: every request before
    # it has finished, so the control plane can attribute them in arrival order
    arrival_index: Count = 0
    oldest_unfinished_index: Count = 0
    unit_hashes: UnitHashes = ""  # prompt and output; the store keeps only salted hashes
    match_stop: MatchStop | None = None
    # what a what-if needs to replay it: the engine's step count when it arrived, and where
    # its chat messages ended (`checkpoint_offsets`)
    arrival_step: Count = 0
    checkpoint_offsets: list[Int] = []

    def to_dict(self) -> dict:
        event = super().to_dict()
        if self.match_stop is not None:
            event["match_stop"] = structs.asdict(self.match_stop)
        return event


class PinUpdated(CacheEvent):
    type: ClassVar[str] = "PinUpdated"
    pin_id: Id
    state: PinState
    num_tokens: Int
    boundary: Int
    keys: dict[Text, Text] = {}
    block_ids: dict[Text, list[Int]] = {}
    reason: Text | None = None
    arrival_index: Count | None = None  # its prefill's place in the engine's arrival order
    unit_hashes: UnitHashes = ""  # the pinned prefix's chained unit hashes, as a request's
    arrival_step: Count | None = None  # the engine's step count when its prefill arrived


# --- engines without physical block ids ---------------------------------------------------
# vLLM and SGLang publish their KV-cache events keyed by block hash alone; `junction attach`
# bridges them in as these. The store keeps such an engine's cache per rank, group and medium,
# hash-keyed (its parent, token count and a token sample), beside what the scrapes of the
# engine's Prometheus endpoint say of hits.

PeerGroup = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"\A[a-z][a-z0-9_]*\Z")]
Medium = Annotated[str, Meta(min_length=1, max_length=32, pattern=ID_PATTERN)]
MAX_PEER_TOKENS = 1 << 20  # tokens one PeerBlockStored carries


class PeerBlockStored(CacheEvent):
    """Blocks a peer stored in one group, chained: block i's parent is block i - 1, the first
    one's `parent_block_hash` (None at the root). `token_ids` are the blocks' tokens in order,
    `block_size` each. `group` names what the group holds ("attention", "mamba",
    "sliding_window", ...: the peer's cache spec kind), `group_idx` is the peer's own index."""

    type: ClassVar[str] = "PeerBlockStored"
    rank: Count32  # the data-parallel rank that published it
    group_idx: Count32
    group: PeerGroup
    medium: Medium  # "GPU", "CPU" or "STORAGE" (the peer's tier)
    block_hashes: list[Hex]
    parent_block_hash: Hex | None
    block_size: Count32
    token_ids: Annotated[list[Int], Meta(max_length=MAX_PEER_TOKENS)]
    lora_name: Text | None = None


class PeerBlockRemoved(CacheEvent):
    type: ClassVar[str] = "PeerBlockRemoved"
    rank: Count32
    group_idx: Count32
    group: PeerGroup
    medium: Medium
    block_hashes: list[Hex]


class PeerCacheCleared(CacheEvent):
    """The peer dropped every block of the rank (in one medium, or all when None)."""

    type: ClassVar[str] = "PeerCacheCleared"
    rank: Count32
    medium: Medium | None = None


class PeerResync(CacheEvent):
    """The bridge lost the rank's batches from `first_missing_seq` to before `resumed_seq`
    and could not fill the gap (`reason`: no replay socket, the replay no longer held them, the
    publisher restarted). The stored table may hold blocks the peer has since removed, or
    miss ones it stored, until they are stored or removed again."""

    type: ClassVar[str] = "PeerResync"
    rank: Count32
    first_missing_seq: Int
    resumed_seq: Int
    reason: Text


class PeerMetrics(CacheEvent):
    """One scrape of the peer's Prometheus endpoint: its cumulative prefix-cache counters (in
    tokens) and cache usage (0..1), as of `scraped_ts` (Unix seconds)."""

    type: ClassVar[str] = "PeerMetrics"
    rank: Count32
    scraped_ts: Finite
    queries_tokens: Annotated[float, Meta(ge=0, le=sys.float_info.max)]
    hits_tokens: Annotated[float, Meta(ge=0, le=sys.float_info.max)]
    usage: Annotated[float, Meta(ge=0, le=1)] | None = None


PEER_EVENTS = (PeerBlockStored, PeerBlockRemoved, PeerCacheCleared, PeerResync, PeerMetrics)

Event = (
    BlockStored
    | BlockRemoved
    | UnitLoaded
    | AllBlocksCleared
    | BlockCopied
    | BlockHashesMoved
    | BlockStateChanged
    | RequestFinished
    | PinUpdated
    | PeerBlockStored
    | PeerBlockRemoved
    | PeerCacheCleared
    | PeerResync
    | PeerMetrics
)
EVENT_TYPES: tuple[type[CacheEvent], ...] = get_args(Event)
