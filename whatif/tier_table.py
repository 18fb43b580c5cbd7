"""`junction whatif --tier-curve host|disk`: what a tier of each size would buy, as a table.

`tier_curve` is the hit rate against one tier's size, the device and the other tier fixed: each
point a replay of the recording with those tiers (`whatif.run.replay_setting`, `whatif.tiers`),
or, at a rate below 1, of a sample of the prefix families with the device and both tiers scaled
by the share of the traffic it kept (`whatif.curves.sample_recording`), corrected by a control
variate (the whole recording's replay with no tiers less the sample's).

The device pools stay as they ran; the tier tried grows from none to 64 times the bytes the
device pools hold (or `--tier-sizes`), the other tier none. Each point is an exact replay
(`tier_curve` at rate 1), within the what-if budget: sampled replays of the prefix
families did not hold to 2 points of exact ones on `benchmarks/whatif.py`'s shapes, so a
tier's curve is not sampled (docs/operations.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from rich.table import Table

from engine.config import CacheConfig, SchedulerConfig
from engine.tiers.stack import HOST
from whatif.budget import Deadline, Limits, check, estimate, size_of
from whatif.curves import _num_tokens, _scaled, sample_recording
from whatif.recording import Recording
from whatif.run import replay_setting
from whatif.settings import size_text
from whatif.tiers import TIERS, default_unit_bytes

#: the default sizes, as multiples of the bytes the device pools hold
DEVICE_MULTIPLES = (0.5, 1, 2, 4, 8, 16, 64)


def parse_bytes_list(text: str, flag: str, count: int | None = None) -> list[int]:
    """`1024,2048` as integers >= 0; a `ValueError` names `flag` and what is wrong."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"{flag} must be byte counts separated by commas, got {text!r}")
    if count is not None and len(parts) != count:
        raise ValueError(f"{flag} takes {count} byte counts, got {len(parts)} in {text!r}")
    return [int(p) for p in parts]


def device_bytes(cache: CacheConfig, unit_bytes: tuple[int, int]) -> int:
    """What the device pools hold, counted as a tier counts a unit: attention tokens and
    states at `unit_bytes`."""
    token, state = unit_bytes
    return cache.num_blocks * cache.attention_block_size * token + cache.mamba_num_blocks * state


def tier_curve_table(
    args: argparse.Namespace,
    recording: Recording,
    base: tuple[CacheConfig, SchedulerConfig] | None,
    limits: Limits,
) -> Table:
    from tqdm import tqdm

    from whatif.settings import ran_configs

    tier = args.tier_curve
    unit_bytes = None
    if args.unit_bytes:
        token, state = parse_bytes_list(args.unit_bytes, "--unit-bytes", 2)
        if not token or not state:
            raise ValueError(f"--unit-bytes must be positive, got {args.unit_bytes!r}")
        unit_bytes = (token, state)
    cache, scheduler = base if base is not None else ran_configs(recording.geometry)
    device = device_bytes(cache, unit_bytes or default_unit_bytes())
    if args.tier_sizes:
        sizes = parse_bytes_list(args.tier_sizes, "--tier-sizes")
    else:
        sizes = [0, *(round(device * multiple) for multiple in DEVICE_MULTIPLES)]
    with tqdm(total=len(sizes), desc=f"{tier} curve", disable=args.quiet or None,
              file=sys.stderr) as bar:  # fmt: skip
        points = tier_curve(
            recording, cache, scheduler, tier, sizes, 1.0, unit_bytes=unit_bytes,
            progress=lambda _: bar.update(), limits=limits,
        )  # fmt: skip
    table = Table(
        title=f"hit rate against {tier} size, the device pools as ran ({size_text(device)}) and "
        f"no {'disk' if tier == 'host' else 'host memory'} (exact replays)",
        title_justify="left",
    )
    for header in (f"{tier} bytes", "x device", "hit rate", "from device", f"from {tier}"):
        table.add_column(header, justify="right")
    for point in points:
        table.add_row(
            size_text(point.num_bytes),
            f"{point.num_bytes / device:.2g}" if device else "-",
            f"{point.hit_rate:.1%}",
            f"{point.by_tier['device']:.1%}",
            f"{point.by_tier[tier]:.1%}",
        )
    return table


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
