"""The wire schema between an engine and the control plane, version 1.

Frames are JSON (websocket text frames) or msgpack (binary frames) and are validated on the way
in. The protocol, engine -> control plane unless marked:

1. `hello`   `{engine_id, epoch, instance_id, geometry, model}`; an engine start is a new
   epoch (its start time in ns). `instance_id` names the engine process (random per start,
   `new_instance_id`; empty from engines before it): while one process holds an engine id,
   another's hello is refused (4411), so two engines left at one `--engine-id` are told apart.
   `geometry` is the typed `engine.geometry.CacheGeometry`; `model` is free-form JSON.
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

What a frame may hold is declared on its `Struct`s, here and in `engine.events`: ids of
bounded length without control characters, strings without NUL or lone surrogates, finite
floats, integers the store's columns hold; the hello's free-form `model` is JSON no deeper
than `MAX_NESTING` with the same strings and numbers (its `geometry` is typed, so its shape
bounds its nesting). A frame nested past what the decoder recurses into is refused like any
other bad frame.

Close codes for bad input: 4401 missing or wrong token, 4400 a frame that is not valid JSON or
msgpack or not a valid frame (unknown event type included; the reason names the field and,
when the frame has one, its seq), 4409 a batch for another engine or epoch, or a hello older
than the engine's stored epoch or far ahead of the control plane's clock, 4411 a hello for an
engine id another live engine process holds, 4422 a seq from the future, 1009 an oversized
frame.
"""

from __future__ import annotations

import math
import re
import secrets
import sys
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct

from engine.events import (  # noqa: F401  (re-exported: the wire's vocabulary)
    ATTENTION,
    BLOCK_STATES,
    GROUPS,
    HEX_PATTERN,
    ID_PATTERN,
    INT64_MAX,
    MAMBA,
    REASONS,
    TEXT_PATTERN,
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
    Finite,
    Group,
    Hex,
    PinUpdated,
    Reason,
    RequestFinished,
)
from engine.geometry import CacheGeometry, GroupShape  # noqa: F401  (the hello's geometry)

SCHEMA_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_SNAPSHOT_CHUNKS = 4096  # frames one snapshot may take (the store bounds their bytes too)

CLOSE_UNAUTHORIZED = 4401
CLOSE_BAD_FRAME = 4400
CLOSE_WRONG_ENGINE = 4409
CLOSE_ID_TAKEN = 4411  # another live engine process holds this engine id: give each its own
CLOSE_STOPPING = 1001  # (engine) going away: it stops, so its engine id's lease ends now
CLOSE_FUTURE_SEQ = 4422
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013  # the control plane's store is unavailable: reconnect later
# a newer hello of this engine took over (on this replica or another): this socket is stale
CLOSE_SUPERSEDED = 4410

# pydantic (the REST API's engine ids) reads `$` as the end; Python's `re` (msgspec) as the end
# or a final newline, hence `\Z` here
ENGINE_ID_PATTERN = r"^[A-Za-z0-9._:@-]+$"
ENGINE_ID_REGEX = r"\A[A-Za-z0-9._:@-]+\Z"
EngineId = Annotated[str, Meta(min_length=1, max_length=128, pattern=ENGINE_ID_REGEX)]
# an engine process's id in its hello; empty: an engine from before instance ids
InstanceId = Annotated[str, Meta(max_length=64, pattern=r"\A[A-Za-z0-9._:@-]*\Z")]
MAX_NESTING = 32  # levels of the hello's free-form JSON (`model`)
MAX_MODEL_BYTES = 64 * 1024  # its size as JSON: the store keeps it and serves it in every list


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
    instance_id: InstanceId = ""
    geometry: CacheGeometry = CacheGeometry()
    model: dict[str, Any] = {}

    def __post_init__(self) -> None:
        """The free-form `model` holds what the store's JSON column can, in at most
        `MAX_MODEL_BYTES` (raised in msgspec's own `- at` form, so `decode` names the field as
        it does for any other). A hello built
        in Python with a plain dict for `geometry` gets it checked and typed here."""
        if isinstance(self.geometry, dict):
            msgspec.structs.force_setattr(
                self, "geometry", msgspec.convert(self.geometry, CacheGeometry)
            )
        problem = _json_problem(self.model, "$.model", 1)
        if problem is not None:
            message, where = problem
            raise ValueError(f"{message} - at `{where}`")
        size = len(msgspec.json.encode(self.model))
        if size > MAX_MODEL_BYTES:
            raise ValueError(f"{size} bytes of JSON, at most {MAX_MODEL_BYTES} - at `$.model`")


def new_instance_id() -> str:
    """A hello's `instance_id`: random, one per engine process start."""
    return secrets.token_hex(8)


class Welcome(_Frame, tag="welcome"):
    type: ClassVar[str] = "welcome"
    epoch: int
    next_seq: int


class Batch(_Frame, tag="batch"):
    type: ClassVar[str] = "batch"
    engine_id: EngineId
    epoch: Count
    seq: Count
    ts: Finite
    events: list[Event]


class CarriedRequest(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A finished request whose batch a snapshot replaced: `seq` is that batch's, so a store
    that had already committed it (`seq` below its next seq) skips the request."""

    seq: Count
    event: RequestFinished


class Snapshot(_Frame, tag="snapshot"):
    """The block table, replacing every batch the engine could no longer resend; the finished
    requests of those batches ride along in `requests` (a snapshot re-establishes the table,
    never the request history).

    A table too big for one frame goes as `num_chunks` frames of one seq, `chunk` 0 first, each
    with a share of the rows and requests (`snapshot_chunks`); the store applies them as one
    snapshot once the last has come, and acknowledges the seq then."""

    type: ClassVar[str] = "snapshot"
    engine_id: EngineId
    epoch: Count
    seq: Count
    ts: Finite
    blocks: list[BlockRow]
    pins: list[PinUpdated] = []
    requests: list[CarriedRequest] = []
    chunk: Annotated[int, Meta(ge=0, le=MAX_SNAPSHOT_CHUNKS - 1)] = 0
    num_chunks: Annotated[int, Meta(ge=1, le=MAX_SNAPSHOT_CHUNKS)] = 1
    # what the engine's outbox gave up in this epoch, so far (the store shows it)
    num_batches_dropped: Count = 0
    num_requests_dropped: Count = 0
    last_drop: Annotated[str, Meta(max_length=1000)] | None = None


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
# msgspec's `- at `$.a.b[0]`` (a value) or `- at `key` in `$.a.b`` (a mapping's key)
_WHERE = re.compile(r" - at (`key` in )?`\$\.?(.*)`$")
_TEXT = re.compile(TEXT_PATTERN)


def encode(frame: Struct | dict, binary: bool = False) -> str | bytes:
    """A frame (or a dict in a frame's shape) as a text frame's JSON or a binary frame's
    msgpack."""
    if binary:
        return _MSGPACK_ENCODER.encode(frame)
    return _JSON_ENCODER.encode(frame).decode()


def snapshot_chunks(
    snapshot: Snapshot, binary: bool = False, max_bytes: int = MAX_FRAME_BYTES
) -> list[str | bytes]:
    """`snapshot` encoded as frames of at most `max_bytes`: itself if it fits, else chunks of
    one seq, each with an equal share of the rows and the carried requests (pins go with the
    first). Raises `ValueError` when even one row per chunk would not fit."""
    whole = encode(snapshot, binary)
    if len(whole) <= max_bytes:
        return [whole]
    rows, requests = snapshot.blocks, snapshot.requests
    num = -(-len(whole) * 5 // (max_bytes * 4))  # aim at 80% full: the shares are not even
    while num <= MAX_SNAPSHOT_CHUNKS:
        chunks = [
            encode(
                msgspec.structs.replace(
                    snapshot,
                    blocks=rows[i * len(rows) // num : (i + 1) * len(rows) // num],
                    requests=requests[i * len(requests) // num : (i + 1) * len(requests) // num],
                    pins=snapshot.pins if i == 0 else [],
                    chunk=i,
                    num_chunks=num,
                ),
                binary,
            )
            for i in range(num)
        ]
        if max(map(len, chunks)) <= max_bytes:
            return chunks
        num *= 2
    raise ValueError(
        f"a snapshot of {len(rows)} rows and {len(requests)} requests does not fit "
        f"{MAX_SNAPSHOT_CHUNKS} frames of {max_bytes} bytes"
    )


def decode(data: str | bytes, max_bytes: int = MAX_FRAME_BYTES) -> Frame:
    """Parse and validate one frame; raises `WireError` with the close code to answer, its
    reason naming the field and the frame's seq (when it has one) in a few words."""
    if len(data) > max_bytes:
        raise WireError(CLOSE_TOO_BIG, f"frame of {len(data)} bytes exceeds {max_bytes}")
    binary = isinstance(data, bytes)
    try:
        return _MSGPACK.decode(data) if binary else _JSON.decode(data)
    except msgspec.ValidationError as exc:  # before DecodeError, its base
        message = str(exc)
        match = _WHERE.search(message)
        # `[...]` is msgspec's word for a mapping's value, whatever its key: `.*` here
        path = match.group(2).replace("[...]", ".*") if match else ""
        where = path.replace("[", ".").replace("]", "") if match else "top level"
        if match and match.group(1):
            where = f"a key of {where or 'the frame'}"
        detail = _in_words(message[: match.start()] if match else message)
        reason = f"invalid frame at {where or 'top level'}{_seq_of(data)}: {detail}"
        raise WireError(CLOSE_BAD_FRAME, reason) from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgpack: a string not UTF-8
        kind = "msgpack" if binary else "JSON"
        detail = "a string is not UTF-8" if isinstance(exc, UnicodeDecodeError) else exc
        reason = f"frame is not valid {kind}{_seq_of(data)}: {detail}"
        raise WireError(CLOSE_BAD_FRAME, reason) from exc
    except RecursionError as exc:  # deeper than the decoder recurses (the stack's limit)
        raise WireError(CLOSE_BAD_FRAME, f"frame nested too deep{_seq_of(data)}") from exc


class _Head(Struct, gc=False):
    """The one field of a refused frame its close reason quotes; the rest is skipped."""

    seq: Count | None = None


_HEAD_JSON = msgspec.json.Decoder(_Head, strict=False)
_HEAD_MSGPACK = msgspec.msgpack.Decoder(_Head, strict=False)
# `{"key": scalar, ...` up to a `"seq": N`, before any nested object or array
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
_JSON_MEMBER = rf"\s*{_JSON_STRING}\s*:\s*(?:{_JSON_STRING}|[-+.\w]+)\s*,"
_TOP_LEVEL_SEQ = re.compile(rf'\s*\{{(?:{_JSON_MEMBER})*?\s*"seq"\s*:\s*(\d{{1,19}})\b')
# msgspec's words for the constraints above, and plainer ones (a close reason is short)
_PLAIN_WORDS = {
    f"matching regex {ID_PATTERN!r}": "without control characters",
    f"matching regex {TEXT_PATTERN!r}": "without NUL or lone surrogates",
    f"matching regex {HEX_PATTERN!r}": "of lowercase hex digits",
    f"matching regex {ENGINE_ID_REGEX!r}": "of A-Za-z0-9._:@-",
    f"`float` >= {-sys.float_info.max!r}": "finite `float`",
    f"`float` <= {sys.float_info.max!r}": "finite `float`",
}


def _in_words(detail: str) -> str:
    for words, plain in _PLAIN_WORDS.items():
        detail = detail.replace(words, plain)
    return detail


def _seq_of(data: str | bytes) -> str:
    """` (seq N)` for a refused frame that has a readable integer seq, else nothing."""
    try:
        head = (_HEAD_MSGPACK if isinstance(data, bytes) else _HEAD_JSON).decode(data)
    except RecursionError:  # skipping a field nested too deep: a top-level seq before it
        match = None if isinstance(data, bytes) else _TOP_LEVEL_SEQ.match(data)
        return f" (seq {match.group(1)})" if match else ""
    except (msgspec.DecodeError, UnicodeDecodeError):
        return ""
    return "" if head.seq is None else f" (seq {head.seq})"


def _json_problem(value: object, where: str, depth: int) -> tuple[str, str] | None:
    """What keeps `value` (free-form JSON at `where`, `depth` levels down) out of the store,
    and where it is; None when nothing does."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        return None if _TEXT.match(value) else ("a string with NUL or a lone surrogate", where)
    if isinstance(value, int):
        return None if -INT64_MAX - 1 <= value <= INT64_MAX else ("an integer over 64 bits", where)
    if isinstance(value, float):
        return None if math.isfinite(value) else ("a float that is not finite", where)
    if not isinstance(value, dict | list | tuple):  # msgpack's bin, ext, timestamp
        return (f"a {type(value).__name__}, which JSON cannot hold", where)
    if depth > MAX_NESTING:
        return (f"nested deeper than {MAX_NESTING} levels", where)
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(value, dict) and not (isinstance(key, str) and _TEXT.match(key)):
            return ("a key that is not a string without NUL", where)
        inner = f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]"
        problem = _json_problem(item, inner, depth + 1)
        if problem is not None:
            return problem
    return None
