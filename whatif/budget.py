"""What a what-if run may cost, estimated before it starts and held to while it runs.

A replay builds one engine per setting (one at a time, each dropped before the next) and steps
the recording through it, so a run's memory peaks at its largest setting's pools beside the
recording's synthetic tokens, and its time is every setting's pools built plus every token
stepped once per setting (and once for what ran). The rates are measured on 2 shared CPU cores
(2026-12-06: an engine pool ~370 bytes and ~6.5 us a block of either group; a replay ~40 bytes
and ~4 us a token, oracle and bound included) and rounded up, so an estimate errs on the large
side of memory and not by much on time. Past the time bound a running replay stops
(`Deadline.check`, every engine step): the estimate refuses what cannot fit, the deadline
catches what the estimate missed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import CacheConfig
from whatif.recording import Recording

BYTES_PER_BLOCK = 512  # an attention block or a Mamba slot of the replayed engine's pools
SECONDS_PER_BLOCK = 8e-6  # building it
BYTES_PER_TOKEN = 64  # a synthetic token, its scripts and the engine's request copies
BYTES_PER_UNIT = 48  # a recorded unit hash, as the loaded recording holds it
SECONDS_PER_TOKEN = 4e-6  # stepping one token through one setting, its oracle and bound
#: the defaults of `JUNCTION_WHATIF_MAX_BYTES` and `JUNCTION_WHATIF_MAX_SECONDS`
DEFAULT_MAX_BYTES = 2 << 30
DEFAULT_MAX_SECONDS = 1800.0
BYTES_SETTING = "JUNCTION_WHATIF_MAX_BYTES"
SECONDS_SETTING = "JUNCTION_WHATIF_MAX_SECONDS"


class WhatIfTooLarge(ValueError):
    """The estimate of a run is over a bound: it is refused before it starts."""


class WhatIfTimedOut(RuntimeError):
    """A running replay went past its time bound: it is stopped."""


@dataclass(frozen=True)
class RunSize:
    """What the estimate reads of a recording."""

    num_tokens: int  # prompt + output tokens of every request and pin replayed
    num_units: int  # unit hashes of every chain


@dataclass(frozen=True)
class Limits:
    """A run's bounds: the most bytes it may hold at once and the seconds it may take."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_seconds: float = DEFAULT_MAX_SECONDS

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(f"{BYTES_SETTING} must be positive, got {self.max_bytes}")
        if self.max_seconds <= 0:
            raise ValueError(f"{SECONDS_SETTING} must be positive, got {self.max_seconds}")


@dataclass(frozen=True)
class Estimate:
    """A run's estimated peak bytes and seconds, and the setting whose pools are largest."""

    num_bytes: int
    seconds: float
    largest: str  # the setting whose pools set the peak
    largest_blocks: int  # its attention blocks and Mamba slots


def estimate(size: RunSize, configs: Sequence[tuple[str, CacheConfig]]) -> Estimate:
    """The cost of replaying a recording of `size` once under each `(name, config)` (what
    ran among them when it is replayed). Pure."""
    blocks = {name: c.num_blocks + c.mamba_num_blocks for name, c in configs}
    largest = max(blocks, key=blocks.__getitem__, default="")
    recording = size.num_tokens * BYTES_PER_TOKEN + size.num_units * BYTES_PER_UNIT
    seconds = sum(n * SECONDS_PER_BLOCK for n in blocks.values())
    seconds += len(configs) * size.num_tokens * SECONDS_PER_TOKEN
    peak = blocks.get(largest, 0)
    return Estimate(recording + peak * BYTES_PER_BLOCK, seconds, largest, peak)


def check(cost: Estimate, limits: Limits, num_replays: int) -> None:
    """`WhatIfTooLarge` naming the bound and what to change when `cost` is over `limits`."""
    if cost.num_bytes > limits.max_bytes:
        raise WhatIfTooLarge(
            f"what-if run refused: it would hold about {_gb(cost.num_bytes)} at once, over "
            f"{BYTES_SETTING} ({_gb(limits.max_bytes)}); its largest setting, "
            f"{cost.largest!r}, has {cost.largest_blocks:,} blocks and slots (num_blocks + "
            f"num_mamba_blocks, ~{BYTES_PER_BLOCK} bytes each): lower them, or raise "
            f"{BYTES_SETTING}"
        )
    if cost.seconds > limits.max_seconds:
        raise WhatIfTooLarge(
            f"what-if run refused: its {num_replays} replays would take about "
            f"{cost.seconds:,.0f} s, over {SECONDS_SETTING} ({limits.max_seconds:g} s): "
            f"try fewer settings or smaller pools (num_blocks, num_mamba_blocks), or raise "
            f"{SECONDS_SETTING}"
        )


class Deadline:
    """The time bound of a run under way: `check` raises `WhatIfTimedOut` once it is past."""

    def __init__(self, max_seconds: float) -> None:
        self.max_seconds = max_seconds
        self.started = time.monotonic()

    def check(self) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed > self.max_seconds:
            raise WhatIfTimedOut(
                f"what-if run stopped after {elapsed:,.1f} s, past {SECONDS_SETTING} "
                f"({self.max_seconds:g} s): try fewer settings or smaller pools, or raise "
                f"{SECONDS_SETTING}"
            )


def _gb(num_bytes: float) -> str:
    if num_bytes < 1e9:
        return f"{num_bytes / 1e6:,.1f} MB"
    return f"{num_bytes / 1e9:,.2f} GB"


def size_of(recording: Recording) -> RunSize:
    """A loaded recording's size. Pure."""
    requests = recording.requests
    return RunSize(
        sum(r.num_prompt_tokens + r.num_output_tokens for r in requests),
        sum(len(r.units) for r in requests),
    )
