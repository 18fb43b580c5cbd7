"""The tiers below the device in a what-if: host memory and a model of the disk tier.

A what-if replays with the `null` runner, whose units carry the model's byte counts without
the bytes (`engine.runners.null`). Host memory is the engine's own `HostTier`. The disk is
`ModelDisk`: the engine's `DiskTier` with its index, its least-recently-used leaves and its
counters, less the files. A unit there counts the bytes its file would have
(`unit_file_bytes`: the codec's head, safetensors' header and the tensors' bytes), so it holds,
gives up and returns exactly the units a real directory of that size would, and a what-if of a
terabyte writes nothing.
"""

from __future__ import annotations

import functools
import json

from engine.cache.block import InvariantError
from engine.hashing import BlockHash
from engine.tiers.codec import HEAD
from engine.tiers.counters import TierCounters
from engine.tiers.disk import DiskPut, DiskTier
from engine.tiers.host import HostTier
from engine.tiers.index import Record, UnitIndex
from engine.tiers.stack import DISK, HOST, TierStack
from engine.tiers.unit import TierUnit

TIERS = (HOST, DISK)
#: safetensors' names of torch dtypes, as its header writes them
_DTYPES = {"uint8": "U8", "int64": "I64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@functools.cache
def default_unit_bytes() -> tuple[int, int]:
    """The built-in model's bytes per token of attention and per state (its footprint builds
    the model once: read once a process)."""
    from engine.config import ModelConfig
    from engine.runners.null import NullRunner

    return NullRunner(ModelConfig()).unit_bytes()


def unit_file_bytes(unit: TierUnit) -> int:
    """The length of `unit`'s file (`engine.tiers.codec.encode`) without writing it: the head,
    safetensors' 8-byte length, its JSON header padded to 8 bytes, then the tensors."""
    tensors = {}
    for i, block in enumerate(unit.blocks):
        tensors.update({f"block.{i}.{name}": t for name, t in block.items()})
    tensors.update({f"state.{name}": t for name, t in unit.state.items()})
    header: dict = {
        "__metadata__": {
            "key": unit.key.hex(),
            "parent": "" if unit.parent is None else unit.parent.hex(),
            "start": str(unit.start),
            "end": str(unit.end),
            "num_blocks": str(len(unit.blocks)),
            "fingerprint": "",  # a disk tier's files carry none (a shared store's do)
        }
    }
    offset = 0
    # safetensors lays tensors out by alignment (item size) first, then by name
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        dtype = _DTYPES[str(tensor.dtype).removeprefix("torch.")]
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [0, 0]}
        header[name]["data_offsets"] = [offset, offset + size]
        offset += size
    length = len(json.dumps(header, separators=(",", ":")).encode())
    return HEAD + 8 + -(-length // 8) * 8 + offset


class ModelDisk(DiskTier):
    """A disk tier of `capacity_bytes` that keeps its units in memory (the `null` runner's
    hold no bytes) and counts each as its file's length."""

    def __init__(self, capacity_bytes: int) -> None:  # no directory, no fingerprint
        self.index = UnitIndex(self.name, capacity_bytes)
        self.counters = TierCounters()
        self.units: dict[BlockHash, TierUnit] = {}

    def put(self, unit: TierUnit) -> DiskPut:
        if unit.key in self.index:
            self.index.touch(unit.key)
            return DiskPut(True, [])
        size = unit_file_bytes(unit)
        if size > self.capacity_bytes:
            self.counters.num_refused += 1
            return DiskPut(False, [])
        evicted = self.evict(size, keep=unit.parent)
        if not self.index.can_fit(size):
            self.counters.num_refused += 1
            return DiskPut(False, evicted)
        self.units[unit.key] = unit
        self.index.add(unit.key, Record(unit.parent, size, unit.start, unit.end))
        self.counters.bytes_in += size
        return DiskPut(True, evicted)

    def get(self, key: BlockHash) -> TierUnit | None:
        if key not in self.index:
            self.counters.num_misses += 1
            return None
        self.index.touch(key)
        self.counters.num_hits += 1
        self.counters.bytes_out += self.index.records[key].num_bytes
        return self.units[key]

    def remove(self, key: BlockHash) -> bool:
        if self.index.discard(key) is None:
            return False
        del self.units[key]
        return True

    def check_invariants(self) -> None:
        self.index.check_invariants()
        if self.units.keys() != self.index.records.keys():
            odd = next(iter(self.units.keys() ^ self.index.records.keys()))
            raise InvariantError(f"disk model: unit {odd.hex()} held or indexed, not both")


def model_stack(host_bytes: int, disk_bytes: int) -> TierStack | None:
    """Host memory of `host_bytes` over a disk model of `disk_bytes`; None for neither."""
    if host_bytes <= 0 and disk_bytes <= 0:
        return None
    return TierStack(HostTier(host_bytes), ModelDisk(disk_bytes) if disk_bytes > 0 else None)
