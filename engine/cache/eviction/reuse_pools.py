"""The `reuse` policy as the registry names it: each pool gets a class of its own, the
attention pool's (`reuse_attention.py`) or the Mamba pool's (`reuse_states.py`), both built on
`ReuseLearned` (`reuse.py`, which says what the policy keeps and why)."""

from __future__ import annotations

from engine.cache.block import Block
from engine.cache.entry import Entry
from engine.cache.eviction.base import EvictionPolicy
from engine.cache.eviction.reuse import ReuseLearned
from engine.cache.eviction.reuse_attention import AttentionReuse
from engine.cache.eviction.reuse_states import StateReuse
from engine.hashing import BlockHash


class ReuseByPool(ReuseLearned):
    """The registry's `reuse`: never built itself, it builds each pool's class."""

    @classmethod
    def for_pool(
        cls, blocks: list[Block], entries: dict[BlockHash, Entry], holds_states: bool = False
    ) -> EvictionPolicy:
        """The Mamba pool's policy (`holds_states`) or the attention pool's. Changes nothing."""
        if holds_states:
            return StateReuse(blocks, entries)
        return AttentionReuse(blocks, entries)
