"""Eviction policies: which free block of a pool an allocation gives up next, and which spare
Mamba states are worth a block.

A policy is one class behind `EvictionPolicy` (`base.py`, whose docstrings say what each method
may change), listed by name in `EVICTION_POLICIES` below; a pool builds the one its
`eviction` name chooses. A new policy is a module beside `retention.py` and one line here.
docs/rules.md section 12 says what each keeps.
"""

from __future__ import annotations

from engine.cache.block import Block
from engine.cache.entry import Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.cost import CostAware
from engine.cache.eviction.lru import PlainLRU
from engine.cache.eviction.retention import RetentionLRU
from engine.cache.eviction.reuse import ReuseLearned
from engine.hashing import BlockHash

#: every policy by name; the first is the default
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    ReuseLearned.name: ReuseLearned,
    RetentionLRU.name: RetentionLRU,
    PlainLRU.name: PlainLRU,
    CostAware.name: CostAware,
}
#: the policy `benchmarks/pressure.py` measures best (docs/benchmarks.md)
DEFAULT_EVICTION = ReuseLearned.name


def make_policy(
    name: str, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
) -> EvictionPolicy:
    """The policy `name` over a pool's blocks and entries (`holds_states`: the Mamba pool); a
    ValueError naming the known ones."""
    policy = EVICTION_POLICIES.get(name)
    if policy is None:
        raise ValueError(
            f"unknown eviction policy {name!r}: choose one of {', '.join(EVICTION_POLICIES)}"
        )
    return policy(blocks, entries, holds_states)


__all__ = ["DEFAULT_EVICTION", "EVICTION_POLICIES", "EvictionPolicy", "make_policy"]
