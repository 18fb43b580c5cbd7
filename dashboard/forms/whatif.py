"""What the What-if page's form offers and builds: presets ("as vLLM would", block sizes Ba
and Bm, the match unit U, eviction policies, memory ×0.5 and ×2) turned into the settings of
`POST /engines/{id}/whatif`, beside any the operator types as JSON. Each eviction policy
chosen is tried at every memory chosen too, so each draws a curve of hit rate against memory.
Only what the recording can answer is offered: sizes that are multiples of its unit."""

from __future__ import annotations

import json
from typing import NamedTuple

from client.schema import ATTENTION, MAMBA, CacheGeometry

VLLM = {"label": "as vLLM would", "mode": "vllm"}
BLOCK_SIZES = (16, 32, 64, 128, 256)
MAMBA_BLOCK_SIZES = (256, 512, 1024, 2048)
UNITS = (16, 32, 64, 128, 256)
MEMORY_FACTORS = (0.25, 0.5, 2.0, 4.0)
DEFAULT_MEMORY = (0.5, 2.0)
#: The most settings one run tries (the API's own bound).
MAX_SETTINGS = 32


class Choices(NamedTuple):
    """What the operator picked in the form."""

    vllm: bool = False
    block_sizes: tuple[int, ...] = ()  # Ba
    mamba_block_sizes: tuple[int, ...] = ()  # Bm
    units: tuple[int, ...] = ()  # U
    evictions: tuple[str, ...] = ()
    memory: tuple[float, ...] = ()  # × the pools the engine ran with
    extra: tuple[dict, ...] = ()  # typed as JSON


def offered(sizes: tuple[int, ...], geometry: CacheGeometry) -> list[int]:
    """The sizes a what-if of this engine can try: multiples of its recorded unit."""
    unit = geometry.prefix_match_unit or 1
    return [size for size in sizes if size % unit == 0]


def memory_setting(factor: float, geometry: CacheGeometry, label: str = "") -> dict:
    """Both pools scaled by `factor` from what the engine ran with (a pool its hello did not
    size is left as it was)."""
    setting = {"label": f"{label}memory ×{factor:g}"}
    for field, group in (("num_blocks", ATTENTION), ("num_mamba_blocks", MAMBA)):
        ran = geometry.group_num_blocks(group)
        if ran:
            setting[field] = max(1, round(ran * factor))
    return setting


def build_settings(choices: Choices, geometry: CacheGeometry) -> list[dict]:
    """The settings of the run, in the form's order, none twice."""
    settings: list[dict] = [dict(VLLM)] if choices.vllm else []
    settings += [{"block_size": size} for size in choices.block_sizes]
    settings += [{"mamba_block_size": size} for size in choices.mamba_block_sizes]
    settings += [{"prefix_match_unit": unit} for unit in choices.units]
    settings += [memory_setting(factor, geometry) for factor in choices.memory]
    for policy in choices.evictions:
        if policy != geometry.eviction:  # what ran is tried anyway
            settings.append({"label": policy, "eviction": policy})
        for factor in choices.memory:
            settings.append({**memory_setting(factor, geometry, f"{policy}, "), "eviction": policy})
    settings += list(choices.extra)
    unique: dict[str, dict] = {}
    for setting in settings:
        unique.setdefault(json.dumps(setting, sort_keys=True), setting)
    return list(unique.values())


def parse_extra(text: str) -> tuple[dict, ...]:
    """The JSON box: a setting (an object) or a list of them; empty is none. Raises
    `ValueError` saying what is wrong."""
    if not text.strip():
        return ()
    value = json.loads(text)  # a JSONDecodeError is a ValueError
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, dict) for item in items):
        raise ValueError("give a setting as a JSON object, or a list of them")
    return tuple(items)
