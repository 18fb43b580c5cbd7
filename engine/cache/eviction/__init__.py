"""Eviction policies: which free block of a pool an allocation gives up next, and which spare
Mamba states are worth a block.

A policy is one class behind `EvictionPolicy` (`base.py`, whose docstrings say what each method
may change), with any of the optional abilities in `abilities.py` (learning from prompts,
refusing states, reading the other pool) that its callers ask for by type. The registry below
names each policy once and says where its class lives; importing this package loads none of
them (the config checks a name here), a pool loads the one it names (`make_policy`). A new
policy is one module beside `retention.py`, one line in `EVICTION_POLICIES` and its tests.
docs/rules.md section 12 says what each keeps.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.cache.block import Block
    from engine.cache.entry import Entry
    from engine.cache.eviction.base import EvictionPolicy
    from engine.hashing import BlockHash

#: every policy by name -> its class, as `module:Class` within this package; the first is the
#: default, the policy `benchmarks/pressure.py` measures best (docs/benchmarks.md)
EVICTION_POLICIES: dict[str, str] = {
    "reuse": "reuse_pools:ReuseByPool",
    "retention": "retention:RetentionLRU",
    "lru": "lru:PlainLRU",
    "cost": "cost:CostAware",
}
DEFAULT_EVICTION = next(iter(EVICTION_POLICIES))
#: the names a config, a flag or a what-if setting may give
EVICTION_NAMES: tuple[str, ...] = tuple(EVICTION_POLICIES)


def check_eviction(name: str) -> str:
    """`name` when the registry lists it, else a ValueError naming the known ones: the one
    check of an eviction name (the cache config, the benchmark spec and `make_policy` ask it)."""
    if name not in EVICTION_POLICIES:
        known = ", ".join(EVICTION_NAMES)
        raise ValueError(f"unknown eviction policy {name!r}: choose one of {known}")
    return name


def policy_class(name: str) -> type[EvictionPolicy]:
    """The class the registry lists under `name`, its module loaded now (`check_eviction`)."""
    module, _, attribute = EVICTION_POLICIES[check_eviction(name)].partition(":")
    return getattr(import_module(f"{__name__}.{module}"), attribute)


def make_policy(
    name: str, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
) -> EvictionPolicy:
    """The policy `name` over a pool's blocks and entries (`holds_states`: the Mamba pool), as
    its class builds one for that pool (`EvictionPolicy.for_pool`); a ValueError naming the
    known ones."""
    return policy_class(name).for_pool(blocks, entries, holds_states)


__all__ = [
    "DEFAULT_EVICTION",
    "EVICTION_NAMES",
    "EVICTION_POLICIES",
    "check_eviction",
    "make_policy",
    "policy_class",
]
