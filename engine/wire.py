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

Frames are msgspec `Struct`s tagged by `type`, like the events they carry (`engine.events`, the
one declaration of both): `encode` writes them (or plain dicts in their shape), `decode` parses
and validates in one pass, lax as to spelling (`"1"` for 1) as the control plane always was.

Close codes for bad input: 4401 missing or wrong token, 4400 a frame that is not valid JSON or
msgpack or not a valid frame (unknown event type included), 4409 a batch for another engine,
4422 a seq from the future, 1009 an oversized frame.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct

from engine.events import (  # noqa: F401  (re-exported: the wire's vocabulary)
    BLOCK_STATES,
    GROUPS,
    REASONS,
    AllBlocksCleared,
    BlockCopied,
    BlockHashesMoved,
    BlockRemoved,
    BlockRow,
    BlockState,
    BlockStateChanged,
    BlockStored,
    Count,
    Event,
    Group,
    Hex,
    PinUpdated,
    Reason,
    RequestFinished,
)

SCHEMA_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024

CLOSE_UNAUTHORIZED = 4401
CLOSE_BAD_FRAME = 4400
CLOSE_WRONG_ENGINE = 4409
CLOSE_FUTURE_SEQ = 4422
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013  # the control plane's store is unavailable: reconnect later

# pydantic (the REST API's engine ids) reads `$` as the end; Python's `re` (msgspec) as the end
# or a final newline, hence `\Z` here
ENGINE_ID_PATTERN = r"^[A-Za-z0-9._:@-]+$"
EngineId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"\A[A-Za-z0-9._:@-]+\Z")]


class WireError(ValueError):
    """A frame that cannot be accepted: `code` is the websocket close code to answer with."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _Frame(Struct, frozen=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    type: ClassVar[str]


class Hello(_Frame, tag="hello", kw_only=True):
    type: ClassVar[str] = "hello"
    version: Literal[1] = SCHEMA_VERSION
    engine_id: EngineId
    epoch: Count
    geometry: dict[str, Any] = {}
    model: dict[str, Any] = {}


class Welcome(_Frame, tag="welcome"):
    type: ClassVar[str] = "welcome"
    epoch: int
    next_seq: int


class Batch(_Frame, tag="batch"):
    type: ClassVar[str] = "batch"
    engine_id: EngineId
    epoch: Count
    seq: Count
    ts: float
    events: list[Event]


class Snapshot(_Frame, tag="snapshot"):
    type: ClassVar[str] = "snapshot"
    engine_id: EngineId
    epoch: Count
    seq: Count
    ts: float
    blocks: list[BlockRow]
    pins: list[PinUpdated] = []


class Ack(_Frame, tag="ack"):
    type: ClassVar[str] = "ack"
    seq: int


class Command(_Frame, tag="command"):
    """Control plane -> engine: `pin {pin_id, token_ids, cache_salt}`, with `messages` (chat
    messages the engine renders with its template) for a pin of a system prompt; `unpin
    {pin_id}`."""

    type: ClassVar[str] = "command"
    command: Literal["pin", "unpin"]
    payload: dict[str, Any]


Frame = Hello | Welcome | Batch | Snapshot | Ack | Command
_JSON_ENCODER = msgspec.json.Encoder()
_MSGPACK_ENCODER = msgspec.msgpack.Encoder()
_JSON = msgspec.json.Decoder(Frame, strict=False)
_MSGPACK = msgspec.msgpack.Decoder(Frame, strict=False)
_WHERE = re.compile(r" - at `\$\.?(.*)`$")


def encode(frame: Struct | dict, binary: bool = False) -> str | bytes:
    """A frame (or a dict in a frame's shape) as a text frame's JSON or a binary frame's
    msgpack."""
    if binary:
        return _MSGPACK_ENCODER.encode(frame)
    return _JSON_ENCODER.encode(frame).decode()


def decode(data: str | bytes, max_bytes: int = MAX_FRAME_BYTES) -> Frame:
    """Parse and validate one frame; raises `WireError` with the close code to answer."""
    if len(data) > max_bytes:
        raise WireError(CLOSE_TOO_BIG, f"frame of {len(data)} bytes exceeds {max_bytes}")
    binary = isinstance(data, bytes)
    try:
        return _MSGPACK.decode(data) if binary else _JSON.decode(data)
    except msgspec.ValidationError as exc:  # before DecodeError, its base
        message = str(exc)
        match = _WHERE.search(message)
        where = match.group(1).replace("[", ".").replace("]", "") if match else "top level"
        detail = message[: match.start()] if match else message
        reason = f"invalid frame at {where or 'top level'}: {detail}"
        raise WireError(CLOSE_BAD_FRAME, reason) from exc
    except msgspec.DecodeError as exc:
        kind = "msgpack" if binary else "JSON"
        raise WireError(CLOSE_BAD_FRAME, f"frame is not valid {kind}: {exc}") from exc
