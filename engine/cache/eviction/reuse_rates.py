"""How often the cached blocks of each class were read again: the rates the `reuse` policy
orders its classes by, learnt from what the pool does, with ghosts of evicted blocks so that a
class the policy gives up early still learns when giving it up was a mistake.

A class is a block's highest-retention reason and whether it was read since it was cached
(`reuse.py`). A block *departs* its class when it is read (a hit: a request resumes from it or
holds it as a prefix) or given up (an eviction). An evicted block leaves a ghost, its deepest
key and class, in a bounded FIFO; a later request whose prompt's deepest known key (cached or
ghost) is a ghost counts a hit for the ghost's class: keeping it would have paid. The rate of a
class is `(hits + PRIOR * prior) / (departures + PRIOR)`, where `prior` is the reason's
retention over the highest retention, so that before anything is learnt the classes keep
`retention`'s order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.hashing import BlockHash

PRIOR = 4.0  # departures the prior is worth
GHOSTS_PER_BLOCK = 4  # ghosts kept per block of the pool


class ReuseRates:
    """Per class, hits over departures (with a prior), and the ghosts of evicted blocks."""

    def __init__(self, priors: Sequence[float], num_blocks: int) -> None:
        self.priors = list(priors)
        self.hits = [0] * len(priors)
        self.departures = [0] * len(priors)
        self.max_ghosts = GHOSTS_PER_BLOCK * max(num_blocks, 1)
        # deepest key of an evicted block -> its class, oldest first
        self.ghosts: OrderedDict[BlockHash, int] = OrderedDict()

    def rate(self, klass: int) -> float:
        """The share of departures from `klass` that were hits. Changes nothing."""
        prior = self.priors[klass]
        return (self.hits[klass] + PRIOR * prior) / (self.departures[klass] + PRIOR)

    def hit(self, klass: int) -> None:
        """A block of `klass` was read again."""
        self.hits[klass] += 1
        self.departures[klass] += 1

    def evicted(self, klass: int, key: BlockHash) -> None:
        """A block of `klass` whose deepest key is `key` was given up."""
        self.departures[klass] += 1
        self.ghosts.pop(key, None)  # a key given up again is the newest ghost
        self.ghosts[key] = klass
        if len(self.ghosts) > self.max_ghosts:
            self.ghosts.popitem(last=False)

    def observe(
        self, hashes: Sequence[BlockHash], cached: dict[BlockHash, object], deepest_only: bool
    ) -> None:
        """A prompt chains through `hashes`: each ghost past its deepest cached key counts a hit
        for its class (the request would have read it), and goes; with `deepest_only` (states:
        a request resumes from one) only the deepest such ghost."""
        ghosts = self.ghosts
        for key in reversed(hashes):
            if key in cached:
                return
            klass = ghosts.pop(key, None)
            if klass is not None:
                self.hits[klass] += 1
                if deepest_only:
                    return
