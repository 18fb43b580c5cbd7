"""`--kv-cache-memory`: the bytes the caches may take, and the attention blocks and Mamba state
slots they buy.

The budget is bytes (`8GiB`, `512MiB`, `1.5GB`, `1000000`), or a fraction in (0, 1] (`0.9`)
of the memory free on the model's device when the engine starts, less the weights, which
load after (CUDA: `torch.cuda.mem_get_info`; the CPU: `MemAvailable` of /proc/meminfo).

The split: both pools cover the same number of tokens. An attention block of `Ba` tokens costs
`Ba` times a token's keys and values; a Mamba slot holds the state at the end of one Mamba block
of `Bm` tokens. So `M` bytes cover `T = M / (token bytes + slot bytes / Bm)` tokens: `T // Ba`
attention blocks, and the Mamba slots take the rest of `M`. Policies that keep states between
block boundaries (junction, message and interval checkpoints) want more slots than one per
`Bm` tokens: `--num-mamba-blocks` then fixes the slots, and the attention blocks take the rest.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from engine.scheduling.capacity import ATTENTION_EXTRA_BLOCKS, MAMBA_EXTRA_BLOCKS
from engine.setup.footprint import Footprint

OPTION = "--kv-cache-memory"
UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
#: a request's fewest blocks: one of its own and the extras it may hold at once
MIN_BLOCKS = 1 + ATTENTION_EXTRA_BLOCKS
MIN_MAMBA_BLOCKS = 1 + MAMBA_EXTRA_BLOCKS


class MemoryBudget(NamedTuple):
    """Exactly one of the two is set."""

    num_bytes: int | None
    fraction: float | None  # of the device's free memory less the weights


class PoolSizes(NamedTuple):
    num_blocks: int  # attention blocks
    num_mamba_blocks: int  # Mamba state slots


def parse_budget(text: str) -> MemoryBudget:
    """`8GiB` / `512MiB` / `1000000` as bytes, `0.9` as a fraction; `ValueError` naming the
    option otherwise. A plain number up to 1 is a fraction, a larger whole one is bytes."""
    match = _AMOUNT.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in UNITS:
        raise ValueError(
            f"{OPTION} {text!r}: give bytes (8GiB, 512MiB, 1.5GB, 1000000) or a fraction of "
            f"free memory in (0, 1] (0.9)"
        )
    number, unit = float(match.group(1)), match.group(2)
    if not unit and number <= 1:
        if number == 0:
            raise ValueError(f"{OPTION} {text!r}: a fraction must lie in (0, 1]")
        return MemoryBudget(None, number)
    if not unit and not number.is_integer():
        raise ValueError(f"{OPTION} {text!r}: a plain number above 1 is bytes, a whole number")
    return MemoryBudget(int(number * UNITS[unit]), None)


def parse_bytes(text: str, option: str) -> int:
    """`8GiB` / `512MiB` / `1.5GB` / `1000000` / `0` as whole bytes; `ValueError` naming
    `option` (its flag and `JUNCTION_*` variable) otherwise."""
    match = _AMOUNT.fullmatch(str(text).strip().lower())
    if match is None or match.group(2) not in UNITS:
        raise ValueError(f"{option} {text!r}: give bytes (8GiB, 512MiB, 1.5GB, 1000000, 0)")
    number = float(match.group(1)) * UNITS[match.group(2)]
    if not match.group(2) and not number.is_integer():
        raise ValueError(f"{option} {text!r}: a plain number is bytes, a whole number")
    return int(number)


def free_memory(device: str) -> int:
    """Bytes free on `device` now (`cuda`, `cuda:N` or `cpu`)."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return free
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("cannot read MemAvailable from /proc/meminfo")


def budget_bytes(budget: MemoryBudget, device: str, weights_bytes: int) -> int:
    """The bytes the caches may take on `device`, where the weights will take theirs."""
    if budget.num_bytes is not None:
        return budget.num_bytes
    free = free_memory(device) - weights_bytes
    if free <= 0:
        raise ValueError(
            f"{OPTION} {budget.fraction}: {device} has no memory free beside the weights "
            f"({weights_bytes} bytes)"
        )
    return int(budget.fraction * free)


def size_pools(
    budget: int,
    cost: Footprint,
    attention_block_size: int,
    mamba_block_size: int,
    num_mamba_blocks: int | None = None,
) -> PoolSizes:
    """The pools `budget` bytes buy by the split rule (or with `num_mamba_blocks` fixed);
    `ValueError` naming the option when that is too few for one request."""
    token, slot = cost.attention_bytes_per_token, cost.mamba_bytes_per_slot
    if not token or not slot:
        raise ValueError(f"{OPTION} sizes hybrid models: this one has no attention or no Mamba")
    block = token * attention_block_size
    if num_mamba_blocks is None:
        tokens = budget / (token + slot / mamba_block_size)
        num_blocks = int(tokens // attention_block_size)
        num_mamba_blocks = (budget - num_blocks * block) // slot
    else:
        num_blocks = max(budget - num_mamba_blocks * slot, 0) // block
    if num_blocks < MIN_BLOCKS or num_mamba_blocks < MIN_MAMBA_BLOCKS:
        raise ValueError(
            f"{OPTION}: {budget} bytes buy {num_blocks} attention blocks of "
            f"{attention_block_size} tokens ({block} bytes each) and {num_mamba_blocks} Mamba "
            f"slots ({slot} bytes each); a request needs at least {MIN_BLOCKS} and "
            f"{MIN_MAMBA_BLOCKS}: raise {OPTION}"
        )
    return PoolSizes(num_blocks, num_mamba_blocks)
