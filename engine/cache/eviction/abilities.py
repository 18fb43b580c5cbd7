"""What only some eviction policies do, beside `EvictionPolicy`: each ability a small base
class that its callers ask for by type (`isinstance`), so a policy carries only what it does.

- `Learns`: shown each admitted prompt's chain (the coordinator, both pools).
- `Admits`: asked which spare Mamba states are worth a block (the coordinator, Mamba pool).
- `Demotes`: asked which states the device gives up are worth a tier below it (the tiers,
  Mamba pool).
- `ReadsPrefixes`: shown the attention pool's entries (a Mamba pool's policy).
- `ReadsSupport`: shown which attention keys the cached states need (an attention pool's
  policy; the coordinator then keeps the counts, `engine.cache.support`).

None of them may change a block's counts, keys or entries, nor the pool's queues except as
each docstring says.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

from engine.cache.entry import CheckpointReason, Entry
from engine.hashing import BlockHash


class Learns(ABC):
    """A policy that learns from the prompts admitted."""

    @abstractmethod
    def observe(self, hashes: Sequence[BlockHash]) -> int | None:
        """A request whose prompt chains through `hashes` is being admitted (told once per
        request, at its first admission, before the states it writes are chosen, so `admits`
        already knows its chain). Changes only what the policy learns, and the place of a
        free block whose value that changes. A policy that learns where prompts diverge
        returns how many of `hashes` this one shared before it branched off earlier prompts
        that went on past them (a state there serves the siblings that follow); None when it
        knows of no such branch."""


class Admits(ABC):
    """A policy that chooses which spare states are written (asked of the Mamba pool's)."""

    #: the reasons whose states `admits` may refuse besides `interval`: what a request writes
    #: for itself (a policy may add `junction` and `message`); a pin state is always written
    REFUSABLE: ClassVar[frozenset[CheckpointReason]] = frozenset(
        {CheckpointReason.BLOCK, CheckpointReason.RESEND, CheckpointReason.EXTENSION}
    )

    @abstractmethod
    def admits(
        self, key: BlockHash, reason: CheckpointReason, span: Sequence[BlockHash] = ()
    ) -> bool:
        """Whether a state keyed `key` is worth a block; asked before it is written, for an
        `interval` state always, and for a state of a `REFUSABLE` reason while the pool has
        no spare block for every state the request writes (a `message` state only when the
        state after it is written, the deepest being asked first). `span`: the request's
        hashes from `key` up to the next state it writes, where a later request would diverge
        and still resume from this one. Changes nothing: asking again, as a waiting request
        does at each admission attempt, gives the same answer."""

    def refused(self, key: BlockHash, reason: CheckpointReason) -> None:
        """A state `admits` refused was not written: told once, when the request that would
        have written it is admitted. The policy may learn from it (as a state given up at
        once) but no block's place changes. Nothing by default."""
        return


class Demotes(ABC):
    """A policy that chooses which states the device gives up go down to the tiers below it
    (asked of the Mamba pool's; `engine.tiers.tiering`). A policy without it sends down every
    state whose attention prefix is still held."""

    @abstractmethod
    def worth_keeping_below(self, key: BlockHash, reason: CheckpointReason) -> bool:
        """Whether the state keyed `key`, kept for `reason`, which the pool is giving up now,
        is likely enough to be read again to spend a tier's bytes on. Changes nothing."""


class ReadsPrefixes(ABC):
    """A Mamba pool's policy that reads the attention pool's entries."""

    @abstractmethod
    def couple(self, prefix_entries: Mapping[BlockHash, Entry]) -> None:
        """Shown the attention pool's entries (read, never changed): a state whose key they
        lack cannot be resumed from, since a hit needs the attention prefix too, so the policy
        may give it up first. Changes only what the policy reads."""


class ReadsSupport(ABC):
    """An attention pool's policy that reads which keys the cached states need."""

    @abstractmethod
    def couple_support(self, support: Mapping[BlockHash, int]) -> None:
        """Shown the attention keys some cached Mamba state needs, a state lying at or past
        the key in its chain, each with a positive count (read, never changed;
        `engine.cache.support`): a block none of whose keys is there serves no hit, since a
        hit resumes from a state. When a key comes or goes, the pool `update`s the free block
        holding it. Changes only what the policy reads."""
