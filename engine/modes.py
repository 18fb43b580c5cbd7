"""The cache modes a benchmark replays a workload under, and the runners it can run them on:
declared here once, for `junction bench`, the control plane's run specs and the dashboard.

A mode is a set of `CacheConfig` fields laid on top of a geometry. Every policy field is
spelled out, so a mode means the same whatever the defaults become: `junction_inline` is the
default policy, and `pins` replays the workload's pin lines on top of it
(`benchmarks/interval.py` compares intervals).
"""

from __future__ import annotations

from typing import Literal, get_args

Mode = Literal["off", "aligned", "partial", "junction", "junction_inline", "pins"]
MODES: tuple[str, ...] = get_args(Mode)

#: the runners a step can run on (`engine.runners.make_runner` builds each)
RunnerName = Literal["null", "ledger", "torch"]
RUNNER_NAMES: tuple[str, ...] = get_args(RunnerName)

_NO_JUNCTIONS = {"junction_checkpoints": False, "checkpoint_mode": "stops"}
#: the default policy: junction checkpoints, inline, interval states at the default interval
_DEFAULT_POLICY = {
    "junction_checkpoints": True,
    "checkpoint_mode": "inline",
    "checkpoint_interval": None,
}

#: what each mode sets on top of the geometry
MODE_CACHE_OPTIONS: dict[str, dict] = {
    "off": {"enable_prefix_caching": False},
    "aligned": {"partial_hits": False, **_NO_JUNCTIONS},
    "partial": {"partial_hits": True, **_NO_JUNCTIONS},
    "junction": {"junction_checkpoints": True, "checkpoint_mode": "stops"},
    "junction_inline": _DEFAULT_POLICY,
    "pins": _DEFAULT_POLICY,
}
