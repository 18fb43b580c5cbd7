"""Cache events: the records the pool and scheduler emit into a sink, declared once.

Names and fields follow vLLM's KV events where they overlap (`BlockStored`, `BlockRemoved`,
`AllBlocksCleared`); the rest is what a hybrid cache needs (block ids, token ranges, partial
entries, checkpoint reasons, copies, moves, per-block state, finished requests, pins).

Each event is a msgspec `Struct` (as vLLM's KV events are), the one declaration the engine, the
publisher and the control plane share: building one checks nothing (the engine's hot path),
encoding it to JSON or msgpack writes `{"type": <class name>, <field>: ...}`, and decoding it
(`engine.wire.decode`) checks every constraint below. `engine.wire` batches them into
`{"engine_id", "epoch", "seq", "ts", "events"}` frames.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Protocol, get_args

from msgspec import Meta, Struct, structs

Hex = Annotated[str, Meta(pattern=r"\A[0-9a-f]+\Z", max_length=128)]
Count = Annotated[int, Meta(ge=0)]
Group = Literal["attention", "mamba"]
Reason = Literal["interval", "block", "resend", "extension", "junction", "pin", "message"]
BlockState = Literal["free", "cached", "in_use", "pinned"]
PinState = Literal["pending", "materialized", "failed", "released"]
GROUPS: tuple[str, ...] = get_args(Group)
REASONS: tuple[str, ...] = get_args(Reason)
BLOCK_STATES: tuple[str, ...] = get_args(BlockState)


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
    block_id: Count
    state: BlockState
    keys: list[Hex]
    token_range: tuple[int | None, int] | None
    is_partial: bool
    checkpoint_reason: Reason | None
    ref_cnt: Count
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
    block_size: int
    group_idx: int
    group: Group
    block_ids: list[int]
    token_range: tuple[int, int]
    is_partial: bool
    checkpoint_reason: Reason | None
    medium: str = "GPU"
    lora_id: int | None = None


class BlockRemoved(CacheEvent):
    type: ClassVar[str] = "BlockRemoved"
    block_hashes: list[Hex]
    group_idx: int
    group: Group
    block_ids: list[int]
    medium: str = "GPU"


class AllBlocksCleared(CacheEvent):
    type: ClassVar[str] = "AllBlocksCleared"
    group_idx: int | None = None
    group: Group | None = None


class BlockCopied(CacheEvent):
    """A copy queued for the step `step`: `consumer` (shared -> private) or `producer`."""

    type: ClassVar[str] = "BlockCopied"
    group_idx: int
    group: Group
    src_block_id: int
    dst_block_id: int
    path: Literal["consumer", "producer"]
    request_id: str
    position: int
    step: int


class BlockHashesMoved(CacheEvent):
    type: ClassVar[str] = "BlockHashesMoved"
    group_idx: int
    group: Group
    block_hashes: list[Hex]
    src_block_id: int
    dst_block_id: int


class BlockStateChanged(CacheEvent):
    """The blocks of one group that changed in a step, each as its whole block-table row, so a
    store that applies these rows holds the engine's table. The engine hands `BlockPool.row`'s
    dicts (encoded as they are); decoding gives `BlockRow`s."""

    type: ClassVar[str] = "BlockStateChanged"
    group_idx: int
    group: Group
    blocks: list[BlockRow]
    step: int


class RequestFinished(CacheEvent):
    type: ClassVar[str] = "RequestFinished"
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
    pin_hits: dict[str, int] = {}
    attention_match_key: Hex | None = None
    junction_token_ids: list[int] | None = None
    # each group's block table when the request finished (`None`: a Mamba slot kept no state)
    block_ids: dict[str, list[int | None]] = {}


class PinUpdated(CacheEvent):
    type: ClassVar[str] = "PinUpdated"
    pin_id: str
    state: PinState
    num_tokens: int
    boundary: int
    keys: dict[str, str] = {}
    block_ids: dict[str, list[int]] = {}
    reason: str | None = None


Event = (
    BlockStored
    | BlockRemoved
    | AllBlocksCleared
    | BlockCopied
    | BlockHashesMoved
    | BlockStateChanged
    | RequestFinished
    | PinUpdated
)
EVENT_TYPES: tuple[type[CacheEvent], ...] = get_args(Event)
