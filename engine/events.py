"""Cache events: plain objects the pool and scheduler emit into a sink.

Names and fields follow vLLM's KV events where they overlap (`BlockStored`, `BlockRemoved`,
`AllBlocksCleared`); the rest is what a hybrid cache needs (block ids, token ranges, partial
entries, checkpoint reasons, copies, moves, per-block state, finished requests, pins). A later
layer batches them into `{"engine_id", "epoch", "seq", "ts", "events"}` envelopes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cache
from typing import ClassVar, Protocol


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


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, slots=True)
class CacheEvent:
    type: ClassVar[str] = "CacheEvent"

    def to_dict(self) -> dict:
        """The event as a plain dict. Shallow: nested rows and lists are shared, not copied
        (`dataclasses.asdict` deep-copies every block row, the publisher's hot path)."""
        return {"type": self.type, **{name: getattr(self, name) for name in _names(type(self))}}


@dataclass(frozen=True, slots=True)
class BlockStored(CacheEvent):
    """Keys registered on one block. `token_range` is `[block start, last valid position)`."""

    type: ClassVar[str] = "BlockStored"
    block_hashes: list[str]
    parent_block_hash: str | None
    block_size: int
    group_idx: int
    group: str
    block_ids: list[int]
    token_range: tuple[int, int]
    is_partial: bool
    checkpoint_reason: str | None
    medium: str = "GPU"
    lora_id: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved(CacheEvent):
    type: ClassVar[str] = "BlockRemoved"
    block_hashes: list[str]
    group_idx: int
    group: str
    block_ids: list[int]
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared(CacheEvent):
    type: ClassVar[str] = "AllBlocksCleared"
    group_idx: int | None = None
    group: str | None = None


@dataclass(frozen=True, slots=True)
class BlockCopied(CacheEvent):
    """A copy queued for the step `step`: `consumer` (shared -> private) or `producer`."""

    type: ClassVar[str] = "BlockCopied"
    group_idx: int
    group: str
    src_block_id: int
    dst_block_id: int
    path: str
    request_id: str
    position: int
    step: int


@dataclass(frozen=True, slots=True)
class BlockHashesMoved(CacheEvent):
    type: ClassVar[str] = "BlockHashesMoved"
    group_idx: int
    group: str
    block_hashes: list[str]
    src_block_id: int
    dst_block_id: int


@dataclass(frozen=True, slots=True)
class BlockStateChanged(CacheEvent):
    """The blocks of one group that changed in a step, each as its whole block-table row
    (`BlockPool.row`: block_id, state, keys, token_range, is_partial, checkpoint_reason,
    ref_cnt, pinned, last_change), so a store that applies these rows holds the engine's table.
    """

    type: ClassVar[str] = "BlockStateChanged"
    group_idx: int
    group: str
    blocks: list[dict]
    step: int


@dataclass(frozen=True, slots=True)
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
    pin_hits: dict[str, int] = field(default_factory=dict)
    attention_match_key: str | None = None
    junction_token_ids: list[int] | None = None
    # each group's block table when the request finished (`None`: a Mamba slot kept no state)
    block_ids: dict[str, list[int | None]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PinUpdated(CacheEvent):
    type: ClassVar[str] = "PinUpdated"
    pin_id: str
    state: str
    num_tokens: int
    boundary: int
    keys: dict[str, str] = field(default_factory=dict)
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    reason: str | None = None
