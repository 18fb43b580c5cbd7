"""`junction whatif --tier-curve host|disk`: what a tier of each size would buy, as a table.

The device pools stay as they ran; the tier tried grows from none to 64 times the bytes the
device pools hold (or `--tier-sizes`), the other tier none. Each point is an exact replay
(`whatif.tiers.tier_curve` at rate 1), within the what-if budget: sampled replays of the prefix
families missed exact ones by up to 16 points on `benchmarks/whatif.py`'s shapes, so a tier's
curve is not sampled (docs/operations.md).
"""

from __future__ import annotations

import argparse
import sys

from rich.table import Table

from engine.config import CacheConfig, SchedulerConfig
from whatif.budget import Limits
from whatif.recording import Recording
from whatif.settings import size_text

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
    from whatif.tiers import default_unit_bytes, tier_curve

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
