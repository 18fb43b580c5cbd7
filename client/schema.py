"""What a client may know of the engine, named here in one list: the hello's geometry, the
cache modes and runners a benchmark run names, the modes and eviction policies (and the
default one) a what-if setting names, the cache groups' names (`GROUPS`: `ATTENTION`,
`MAMBA`), the cache's default block sizes, the byte tokenizer (the ids a pin's text becomes)
and the layers behind each kind of state group. The dashboard imports these from here, never
from `engine` itself (the layering test holds it to that)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.cache.eviction import DEFAULT_EVICTION, EVICTION_NAMES
from engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAMBA_BLOCK_SIZE
from engine.events import ATTENTION, GROUPS, MAMBA
from engine.geometry import CacheGeometry
from engine.lazy import lazy_names
from engine.model.tokenizer import ByteTokenizer
from engine.modes import MODES, RUNNER_NAMES
from engine.setup.model_card import STATE_LAYERS
from whatif.settings import WHATIF_MODES

if TYPE_CHECKING:
    from workloads import build_workload

__all__ = [
    "ATTENTION",
    "GROUPS",
    "MAMBA",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_EVICTION",
    "DEFAULT_MAMBA_BLOCK_SIZE",
    "EVICTION_NAMES",
    "MODES",
    "RUNNER_NAMES",
    "WHATIF_MODES",
    "STATE_LAYERS",
    "ByteTokenizer",
    "CacheGeometry",
    "build_workload",
]


# `build_workload` loads the workloads (and numpy) on its first use (PEP 562): the dashboard's
# benchmark form builds workloads, while the `junction` command, which imports this module
# through `client.rest` for every command's parser, never does.
__getattr__, __dir__ = lazy_names(__name__, {"build_workload": "workloads"}, __all__)
