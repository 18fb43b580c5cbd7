"""The wire schema between an engine and the control plane, version 1.

Frames are JSON (websocket text frames) or msgpack (binary frames) and are validated on the way
in. The protocol, engine -> control plane unless marked:

1. `hello`   `{engine_id, epoch, geometry, model}`; an engine start is a new epoch.
2. `welcome` (control plane) `{epoch, next_seq}`: the seq the store wants next for this epoch
   (0 for a new epoch, whose arrival clears the engine's old table).
3. `batch`   `{engine_id, epoch, seq, ts, events}`: `seq` rises by one per batch in an epoch.
   A batch seen before is acknowledged and skipped; a seq beyond `next_seq` is an error.
4. `snapshot` `{engine_id, epoch, seq, ts, blocks, pins}`: the whole block table (rows as
   `BlockPool.row` makes them) after a gap the engine could not resend; it replaces the
   store's table and takes the seq after the last batch it covers.
5. `ack`     (control plane) `{seq}`: every batch up to `seq` is committed.
6. `command` (control plane) `{command: "pin" | "unpin", payload}`: operator actions.

Close codes for bad input: 4401 missing or wrong token, 4400 a frame that is not valid JSON or
msgpack or not a valid frame (unknown event type included), 4409 a batch for another engine,
4422 a seq from the future, 1009 an oversized frame.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, get_args

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine.events import CacheEvent

SCHEMA_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024

CLOSE_UNAUTHORIZED = 4401
CLOSE_BAD_FRAME = 4400
CLOSE_WRONG_ENGINE = 4409
CLOSE_FUTURE_SEQ = 4422
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013  # the control plane's store is unavailable: reconnect later

EngineId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$")]
Hex = Annotated[str, Field(pattern=r"^[0-9a-f]+$", max_length=128)]
Group = Literal["attention", "mamba"]
Reason = Literal["interval", "block", "resend", "extension", "junction", "pin", "message"]
BlockState = Literal["free", "cached", "in_use", "pinned"]
GROUPS: tuple[str, ...] = get_args(Group)
REASONS: tuple[str, ...] = get_args(Reason)
BLOCK_STATES: tuple[str, ...] = get_args(BlockState)


class WireError(ValueError):
    """A frame that cannot be accepted: `code` is the websocket close code to answer with."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BlockRow(_Model):
    group: Group
    block_id: Annotated[int, Field(ge=0)]
    state: BlockState
    keys: list[Hex]
    token_range: tuple[int | None, int] | None
    is_partial: bool
    checkpoint_reason: Reason | None
    ref_cnt: Annotated[int, Field(ge=0)]
    pinned: bool
    last_change: Annotated[int, Field(ge=0)]


# ---------------------------------------------------------------------------- events
class BlockStored(_Model):
    type: Literal["BlockStored"]
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


class BlockRemoved(_Model):
    type: Literal["BlockRemoved"]
    block_hashes: list[Hex]
    group_idx: int
    group: Group
    block_ids: list[int]
    medium: str = "GPU"


class AllBlocksCleared(_Model):
    type: Literal["AllBlocksCleared"]
    group_idx: int | None = None
    group: Group | None = None


class BlockCopied(_Model):
    type: Literal["BlockCopied"]
    group_idx: int
    group: Group
    src_block_id: int
    dst_block_id: int
    path: Literal["consumer", "producer"]
    request_id: str
    position: int
    step: int


class BlockHashesMoved(_Model):
    type: Literal["BlockHashesMoved"]
    group_idx: int
    group: Group
    block_hashes: list[Hex]
    src_block_id: int
    dst_block_id: int


class BlockStateChanged(_Model):
    type: Literal["BlockStateChanged"]
    group_idx: int
    group: Group
    blocks: list[BlockRow]
    step: int


class RequestFinished(_Model):
    type: Literal["RequestFinished"]
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
    block_ids: dict[str, list[int | None]] = {}


class PinUpdated(_Model):
    type: Literal["PinUpdated"]
    pin_id: str
    state: Literal["pending", "materialized", "failed", "released"]
    num_tokens: int
    boundary: int
    keys: dict[str, str] = {}
    block_ids: dict[str, list[int]] = {}
    reason: str | None = None


Event = Annotated[
    BlockStored
    | BlockRemoved
    | AllBlocksCleared
    | BlockCopied
    | BlockHashesMoved
    | BlockStateChanged
    | RequestFinished
    | PinUpdated,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------------------- frames
class Hello(_Model):
    type: Literal["hello"]
    version: Literal[1] = SCHEMA_VERSION
    engine_id: EngineId
    epoch: Annotated[int, Field(ge=0)]
    geometry: dict[str, Any] = {}
    model: dict[str, Any] = {}


class Welcome(_Model):
    type: Literal["welcome"] = "welcome"
    epoch: int
    next_seq: int


class Batch(_Model):
    type: Literal["batch"]
    engine_id: EngineId
    epoch: Annotated[int, Field(ge=0)]
    seq: Annotated[int, Field(ge=0)]
    ts: float
    events: list[Event]


class Snapshot(_Model):
    type: Literal["snapshot"]
    engine_id: EngineId
    epoch: Annotated[int, Field(ge=0)]
    seq: Annotated[int, Field(ge=0)]
    ts: float
    blocks: list[BlockRow]
    pins: list[PinUpdated] = []


class Ack(_Model):
    type: Literal["ack"] = "ack"
    seq: int


class Command(_Model):
    """Control plane -> engine: `pin {pin_id, token_ids, cache_salt}`, with `messages` (chat
    messages the engine renders with its template) for a pin of a system prompt; `unpin
    {pin_id}`."""

    type: Literal["command"] = "command"
    command: Literal["pin", "unpin"]
    payload: dict[str, Any]


Frame = Annotated[Hello | Welcome | Batch | Snapshot | Ack | Command, Field(discriminator="type")]
_FRAME = TypeAdapter(Frame)
_EVENT = TypeAdapter(Event)


def event_dict(event: CacheEvent) -> dict:
    """An engine event as its wire dict (validated when decoded, not here: the hot path)."""
    return event.to_dict()


def encode(frame: BaseModel | dict, binary: bool = False) -> str | bytes:
    data = frame.model_dump(mode="json") if isinstance(frame, BaseModel) else frame
    if binary:
        return msgpack.packb(data, use_bin_type=True)
    return json.dumps(data, separators=(",", ":"))


def decode(
    data: str | bytes, max_bytes: int = MAX_FRAME_BYTES
) -> Hello | Welcome | Batch | Snapshot | Ack | Command:
    """Parse and validate one frame; raises `WireError` with the close code to answer."""
    if len(data) > max_bytes:
        raise WireError(CLOSE_TOO_BIG, f"frame of {len(data)} bytes exceeds {max_bytes}")
    if isinstance(data, str):
        try:  # parsed and validated in one pass, without the dicts of `json.loads`
            return _FRAME.validate_json(data)
        except ValidationError:
            pass  # the two steps below say what is wrong, as they always have
    try:
        if isinstance(data, bytes):
            raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
        else:
            raw = json.loads(data)
    except (ValueError, msgpack.UnpackException) as exc:
        kind = "msgpack" if isinstance(data, bytes) else "JSON"
        raise WireError(CLOSE_BAD_FRAME, f"frame is not valid {kind}: {exc}") from exc
    try:
        return _FRAME.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise WireError(CLOSE_BAD_FRAME, f"invalid frame at {where}: {first['msg']}") from exc


def validate_event(raw: dict) -> Event:
    return _EVENT.validate_python(raw)
