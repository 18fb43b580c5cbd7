"""One unit as one file: a magic, a checksum, then the unit in safetensors.

    [0, 8)    MAGIC
    [8, 40)   blake2b-256 of everything after it
    [40, ...) safetensors: an 8-byte little-endian header length, a JSON header (the tensors'
              dtypes, shapes and offsets, and the unit's key, parent and range as metadata),
              then the tensor bytes

Tensors are named `block.<i>.<name>` and `state.<name>`. Nothing read from disk is unpickled:
safetensors parses only its header and raw tensor bytes. `decode` checks the checksum before
parsing anything, so a truncated or corrupted file raises `CorruptUnitError`, never returns a
unit; `read_header` reads only the head of a file and its length, for a restart's scan.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from engine.hashing import BlockHash
from engine.tiers.unit import TierUnit

if TYPE_CHECKING:  # torch and safetensors load on the first unit encoded or decoded
    import torch

MAGIC = b"JNCTUNIT"
DIGEST_SIZE = 32
HEAD = len(MAGIC) + DIGEST_SIZE  # bytes before the safetensors body
MAX_HEADER_BYTES = 1 << 24  # a safetensors header longer than this is corrupt


class CorruptUnitError(ValueError):
    """A unit file is truncated, corrupted, or not the unit its name says."""


class ForeignUnitError(CorruptUnitError):
    """An intact unit written for another model or geometry (another fingerprint)."""


class UnitHeader(NamedTuple):
    key: BlockHash
    parent: BlockHash | None
    start: int
    end: int
    file_bytes: int  # the file's whole length, as its header implies


def encode(unit: TierUnit, fingerprint: str = "") -> bytes:
    """The file's bytes for a unit; `fingerprint` (the model and geometry's hash) is written
    in its metadata for a store shared by engines (`engine.tiers.shared`)."""
    tensors = {}
    for i, block in enumerate(unit.blocks):
        tensors.update({f"block.{i}.{name}": t for name, t in block.items()})
    tensors.update({f"state.{name}": t for name, t in unit.state.items()})
    metadata = {
        "key": unit.key.hex(),
        "parent": "" if unit.parent is None else unit.parent.hex(),
        "start": str(unit.start),
        "end": str(unit.end),
        "num_blocks": str(len(unit.blocks)),
        "fingerprint": fingerprint,
    }
    from safetensors.torch import save as save_tensors

    # fresh contiguous copies: safetensors refuses views that share one storage
    body = save_tensors(
        {name: t.detach().contiguous().clone() for name, t in tensors.items()}, metadata
    )
    return MAGIC + hashlib.blake2b(body, digest_size=DIGEST_SIZE).digest() + body


def decode(data: bytes, key: BlockHash, fingerprint: str | None = None) -> TierUnit:
    """The unit in a file's bytes; `CorruptUnitError` unless they check out as `key`'s (and,
    when `fingerprint` is given, as written for it: else `ForeignUnitError`)."""
    if len(data) < HEAD or data[: len(MAGIC)] != MAGIC:
        raise CorruptUnitError(f"unit {key.hex()}: no unit file head ({len(data)} bytes)")
    body = data[HEAD:]
    if hashlib.blake2b(body, digest_size=DIGEST_SIZE).digest() != data[len(MAGIC) : HEAD]:
        raise CorruptUnitError(f"unit {key.hex()}: checksum mismatch ({len(data)} bytes)")
    header = _parse_header(body[:8], body, key)
    if fingerprint is not None and header["fingerprint"] != fingerprint:
        raise ForeignUnitError(
            f"unit {key.hex()}: written for fingerprint {header['fingerprint'] or '(none)'}, "
            f"not {fingerprint}"
        )
    from safetensors.torch import load as load_tensors

    try:
        tensors = load_tensors(body)
    except Exception as error:  # safetensors raises its own error type for a bad body
        raise CorruptUnitError(f"unit {key.hex()}: unreadable body: {error}") from None
    try:
        return _unit(key, header, tensors)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise CorruptUnitError(f"unit {key.hex()}: inconsistent file: {error!r}") from None


def _unit(key: BlockHash, header: dict, tensors: dict[str, torch.Tensor]) -> TierUnit:
    """The unit from a checked file's metadata and its `block.<i>.*` / `state.*` tensors."""
    blocks: list[dict[str, torch.Tensor]] = [{} for _ in range(int(header["num_blocks"]))]
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        where, _, rest = name.partition(".")
        if where == "state":
            state[rest] = tensor
        else:
            index, _, tensor_name = rest.partition(".")
            blocks[int(index)][tensor_name] = tensor
    parent = bytes.fromhex(header["parent"]) if header["parent"] else None
    return TierUnit(key, parent, int(header["start"]), int(header["end"]), tuple(blocks), state)


def read_header(path: Path, key: BlockHash) -> UnitHeader:
    """A unit file's key, parent and range from its head alone, and its implied length;
    `CorruptUnitError` when the head is unreadable or the file's length is not that length."""
    with path.open("rb") as file:
        head = file.read(HEAD + 8)
        if len(head) < HEAD + 8 or head[: len(MAGIC)] != MAGIC:
            raise CorruptUnitError(f"unit {key.hex()}: no unit file head")
        (num_header_bytes,) = struct.unpack("<Q", head[HEAD:])
        if num_header_bytes > MAX_HEADER_BYTES:
            raise CorruptUnitError(f"unit {key.hex()}: header of {num_header_bytes} bytes")
        header_bytes = file.read(num_header_bytes)
        size = file.seek(0, 2)
    header = _parse_header(head[HEAD:], head[HEAD:] + header_bytes, key)
    try:
        ends = [int(spec["data_offsets"][1]) for spec in header["tensors"].values()]
        file_bytes = HEAD + 8 + num_header_bytes + max(ends, default=0)
        parent = bytes.fromhex(header["parent"]) if header["parent"] else None
        found = UnitHeader(key, parent, int(header["start"]), int(header["end"]), file_bytes)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise CorruptUnitError(f"unit {key.hex()}: unreadable header: {error!r}") from None
    if size != file_bytes:
        raise CorruptUnitError(f"unit {key.hex()}: {size} bytes where its header says {file_bytes}")
    return found


def _parse_header(length: bytes, body: bytes, key: BlockHash) -> dict:
    """The safetensors header's metadata, plus its tensor specs under "tensors"; checks that
    it names `key`."""
    try:
        (num_header_bytes,) = struct.unpack("<Q", length)
        header = json.loads(body[8 : 8 + num_header_bytes])
        metadata = header.pop("__metadata__")
        fields = {name: metadata[name] for name in ("key", "parent", "start", "end", "num_blocks")}
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptUnitError(f"unit {key.hex()}: unreadable header: {error!r}") from None
    fields["fingerprint"] = metadata.get("fingerprint", "")
    if fields["key"] != key.hex():
        raise CorruptUnitError(f"unit {key.hex()}: the file holds unit {fields['key']}")
    return {**fields, "tensors": header}
