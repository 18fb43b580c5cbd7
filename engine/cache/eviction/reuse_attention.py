"""The `reuse` policy of the attention pool: the shared queues and rates (`reuse.py`), and the
blocks some cached state needs given up last.

A hit resumes from a Mamba state through the attention before it, so the attention blocks
past every cached state serve no hit. Shown which keys the cached states need
(`couple_support`), this policy gives up a block holding one of them only once no other block
is left: such a block waits in a *supported* place (`Place.supported`), its class's, ranked
after every place that is not. Its horizon is short (`HORIZON_PER_BLOCK`): the pool keeps the
recently used prefixes, the ones the few states are likely to belong to.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.cache.block import Block
from engine.cache.entry import Entry
from engine.cache.eviction.abilities import ReadsSupport
from engine.cache.eviction.reuse import ReuseLearned
from engine.cache.eviction.reuse_places import EMPTY, EMPTY_PLACE, REASON_CLASS, Place
from engine.hashing import BlockHash

# the horizon in frees per block of the pool: short for attention KV (see the module's
# docstring), long for states (`reuse_states.STATE_HORIZON_PER_BLOCK`)
ATTENTION_HORIZON_PER_BLOCK = 1.0


class AttentionReuse(ReuseLearned, ReadsSupport):
    """The attention pool's queues: one per class, and one per class of supported blocks."""

    HORIZON_PER_BLOCK = ATTENTION_HORIZON_PER_BLOCK

    def __init__(self, blocks: list[Block], entries: dict[BlockHash, Entry]) -> None:
        super().__init__(blocks, entries, holds_states=False)
        self.support: Mapping[BlockHash, int] | None = None  # `couple_support`
        # each class's places, unsupported and supported, made once (the hot path reads them)
        self._places = {
            supported: [Place(klass, 0, supported) for klass in range(len(self.rates.priors))]
            for supported in (False, True)
        }

    def couple_support(self, support: Mapping[BlockHash, int]) -> None:
        self.support = support

    def place(self, block: Block) -> Place:
        """The block's class, among the supported places when a cached state needs one of its
        keys (`couple_support`). Changes nothing."""
        klass = self.klass(block)
        if klass == EMPTY:
            return EMPTY_PLACE
        return self._places[self._is_supported(block)][klass]

    def _is_supported(self, block: Block) -> bool:
        support = self.support
        return bool(support) and any(key in support for key in block.keys)

    def _place_to_add(self, block: Block) -> Place:
        keys = block.keys
        if len(keys) == 1:  # `place`, inline for one key: every attention block freed
            key = keys[0]
            klass = REASON_CLASS[self.entries[key].reason] + self._is_read[block.block_id]
            support = self.support
            return self._places[bool(support) and key in support][klass]
        return self.place(block)
