"""Building the tiers an engine starts with, and the figures a load is priced by.

`build_stack` makes the host tier and the disk tier a `TierConfig` asks for; the disk tier's
fingerprint is the model and the cache geometry (and the runner, whose units differ in kind),
so a restart with another of any refuses the directory. `measure_host_bandwidth` and
`measure_disk_bandwidth` time a copy of real bytes once at start; `default_host_bytes` is the
host tier `junction serve` takes without `--host-cache-bytes`: a share of the memory free now.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from engine.config import CacheConfig, ModelConfig, TierConfig
from engine.tiers.disk import DiskTier
from engine.tiers.host import HostTier
from engine.tiers.stack import TierStack
from engine.tiers.tiering import TierCosts

#: the share of the memory free at start that the host tier takes by default
DEFAULT_HOST_SHARE = 0.25
_PROBE_BYTES = 32 << 20


def fingerprint(cache: CacheConfig, model: ModelConfig, runner: str) -> dict:
    """What a unit on disk depends on: the model, its dtype, the cache geometry, the runner."""
    return {
        "runner": runner,
        "model": model.name,
        "model_dir": None if model.model_dir is None else str(Path(model.model_dir).resolve()),
        "dtype": model.dtype,
        "shape": [
            model.vocab_size,
            model.num_layers,
            model.num_attention_layers,
            model.d_model,
            model.num_heads,
            model.num_kv_heads,
            model.seed,
        ],
        "attention_block_size": cache.attention_block_size,
        "mamba_block_size": cache.mamba_block_size,
        "match_unit": cache.match_unit,
    }


def build_stack(config: TierConfig, geometry: dict, with_shared: bool = False) -> TierStack | None:
    """The tiers `config` asks for; None when it asks for none and there is no shared tier
    (which needs a stack, if an empty one, to hold what it loads)."""
    if not config.is_enabled and not with_shared:
        return None
    disk = None
    if config.disk_cache_dir is not None:
        disk = DiskTier(config.disk_cache_dir, config.disk_cache_bytes, geometry)
    return TierStack(HostTier(config.host_cache_bytes), disk)


def tier_costs(config: TierConfig) -> TierCosts | None:
    """The prices of `config`'s rates; None (every load taken) unless all three are given."""
    rates = (config.host_bytes_per_s, config.disk_bytes_per_s, config.prefill_tokens_per_s)
    if any(rate is None for rate in rates):
        return None
    return TierCosts(*rates)  # type: ignore[arg-type]


def free_memory_bytes() -> int | None:
    """The memory the system has available now (`MemAvailable`), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_host_bytes() -> int:
    """`DEFAULT_HOST_SHARE` of the memory free now; 0 where it cannot be read."""
    free = free_memory_bytes()
    return 0 if free is None else int(free * DEFAULT_HOST_SHARE)


def measure_host_bandwidth(device: str = "cpu") -> float:
    """Bytes per second of a copy from host memory to `device` (page-locked on CUDA)."""
    import torch  # here, not at the top: a command that builds no tiers never loads it

    source = torch.ones(_PROBE_BYTES, dtype=torch.uint8)
    if device != "cpu" and torch.cuda.is_available():
        source = source.pin_memory()
    target = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device=device)
    target.copy_(source)  # warm
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        target.copy_(source)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return _PROBE_BYTES / max(best, 1e-9)


def measure_disk_bandwidth(directory: str) -> float:
    """Bytes per second of reading back a file written in `directory` (after the write is
    synced: what a load from the disk tier reads is no fresher than that)."""
    data = os.urandom(_PROBE_BYTES)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe.", delete=True) as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
        started = time.perf_counter()
        with open(file.name, "rb") as again:
            while again.read(1 << 22):
                pass
        return _PROBE_BYTES / max(time.perf_counter() - started, 1e-9)
