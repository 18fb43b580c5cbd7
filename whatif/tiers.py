"""The tiers below the device in a what-if: host memory and a model of the disk tier.

A what-if replays with the `null` runner, whose units carry the model's byte counts without
the bytes (`engine.runners.null`). Host memory is the engine's own `HostTier`. The disk is
`ModelDisk`: the engine's `DiskTier` with its index, its least-recently-used leaves and its
counters, less the files. A unit there counts the bytes its file would have
(`unit_file_bytes`: the codec's head, safetensors' header and the tensors' bytes), so it holds,
gives up and returns exactly the units a real directory of that size would, and a what-if of a
terabyte writes nothing.

`tier_curve` is the hit rate against one tier's size, the device and the other tier fixed: each
point a replay of a sample of the prefix families with the device and both tiers scaled by the
share of the traffic it kept (`whatif.curves.sample_recording`), corrected by a control variate:
the whole recording's replay with no tiers less the sample's. Rate 1 is exact replays.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import NamedTuple

from engine.cache.block import InvariantError
from engine.config import CacheConfig, SchedulerConfig
from engine.hashing import BlockHash
from engine.tiers.codec import HEAD
from engine.tiers.counters import TierCounters
from engine.tiers.disk import DiskPut, DiskTier
from engine.tiers.host import HostTier
from engine.tiers.index import Record, UnitIndex
from engine.tiers.stack import DISK, HOST, TierStack
from engine.tiers.unit import TierUnit
from whatif.budget import Deadline, Limits, check, estimate, size_of
from whatif.recording import Recording

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


class TierPoint(NamedTuple):
    """One point of a tier's curve: the estimate, and what it is made of."""

    num_bytes: int  # the tier's size at full scale
    hit_rate: float  # the estimate: replayed + (base - sampled base), within [0, 1]
    by_tier: dict[str, float]  # the sampled replay's hit rate served by "device", host, disk
    replayed_hit_rate: float  # the sampled replay's hit tokens / its prompt tokens


def tier_curve(
    recording: Recording,
    cache: CacheConfig,
    scheduler: SchedulerConfig,
    tier: str,
    sizes: Sequence[int],
    rate: float,
    other_bytes: int = 0,
    unit_bytes: tuple[int, int] | None = None,
    progress: Callable[[TierPoint], None] | None = None,
    limits: Limits | None = None,
) -> list[TierPoint]:
    """The hit rate with `tier` ("host" or "disk") of each of `sizes` bytes, the device at
    `cache`'s pools and the other tier at `other_bytes`: each point a replay of a `rate`
    sample of the prefix families (`whatif.curves.sample_recording`, by traffic) with the
    device and both tiers scaled by the share of the traffic it kept, plus the whole
    recording's replay without tiers less the sample's (a control variate: a sample heavy in
    popular families hits more at any tier size). Rate 1: exact replays. `limits`: the
    what-if budget (`whatif.budget`), its estimate checked before any replay
    (`WhatIfTooLarge`) and its time at every step (`WhatIfTimedOut`)."""
    from whatif.curves import _num_tokens, _scaled, sample_recording
    from whatif.run import replay_setting

    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
    sample = sample_recording(recording, rate) if rate < 1 else recording
    requests = [r for r in sample.requests if not r.pin]
    if not requests:
        raise ValueError(f"a {rate} sample of {recording.num_requests} requests is empty")
    share = _num_tokens(requests) / _num_tokens(recording.requests) if rate < 1 else 1.0
    longest = max(r.num_prompt_tokens + max(1, r.num_output_tokens) for r in requests)
    ratio = cache.mamba_num_blocks / cache.num_blocks
    pins = sum(1 for r in sample.requests if r.pin)
    scaled = _scaled(cache, cache.num_blocks * share, ratio, longest, pins) if rate < 1 else cache
    prompt_tokens = sum(r.num_prompt_tokens for r in requests)
    deadline = None
    if limits is not None:
        named = [(f"{tier} {size}", scaled) for size in sizes]
        named += [] if rate == 1 else [("sample, no tiers", scaled)]
        cost = estimate(size_of(sample), named)
        if rate < 1:  # the whole recording, once
            whole = estimate(size_of(recording), [("whole, no tiers", cache)])
            cost = dataclasses.replace(
                max(cost, whole, key=lambda e: e.num_bytes), seconds=cost.seconds + whole.seconds
            )
        check(cost, limits, len(named) + (rate < 1))
        deadline = Deadline(limits.max_seconds)
    correction = 0.0
    if rate < 1:  # the control variate: no tiers, whole against sampled
        whole = replay_setting(recording, cache, scheduler, deadline=deadline).hits
        part = replay_setting(sample, scaled, scheduler, deadline=deadline).hits
        correction = sum(whole) / max(recording.num_prompt_tokens, 1) - sum(part) / prompt_tokens
    points = []
    for size in sizes:
        host, disk = (size, other_bytes) if tier == HOST else (other_bytes, size)
        tiers = (round(host * share), round(disk * share))
        replayed = replay_setting(
            sample, scaled, scheduler, deadline=deadline, tiers=tiers, unit_bytes=unit_bytes
        )
        hit = sum(replayed.hits) / prompt_tokens
        by_tier = {
            name: sum(t.get(name, 0) for t in replayed.by_medium) / prompt_tokens for name in TIERS
        }
        by_tier = {"device": hit - sum(by_tier.values()), **by_tier}
        point = TierPoint(int(size), min(max(hit + correction, 0.0), 1.0), by_tier, hit)
        points.append(point)
        if progress is not None:
            progress(point)
    return points
