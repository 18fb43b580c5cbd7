"""Cache entries and the checkpoint reasons that order their retention."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from engine.hashing import BlockHash


class CheckpointReason(StrEnum):
    """Why an entry exists; it decides how long a free block holding it is kept."""

    INTERVAL = "interval"  # a spare state every `checkpoint_interval` tokens (inline)
    BLOCK = "block"
    RESEND = "resend"
    EXTENSION = "extension"
    JUNCTION = "junction"
    MESSAGE = "message"  # where a rendered chat message ends
    PIN = "pin"

    @property
    def retention(self) -> int:
        """How long a free block holding it is kept: the default eviction policy gives up
        blocks of a lower retention first; pins never are."""
        return RETENTION[self]


#: Each reason's retention, as a plain dict for the pool's hot paths.
RETENTION = {
    CheckpointReason.INTERVAL: 1,
    CheckpointReason.BLOCK: 2,
    CheckpointReason.RESEND: 3,
    CheckpointReason.EXTENSION: 3,
    CheckpointReason.JUNCTION: 4,
    CheckpointReason.MESSAGE: 4,
    CheckpointReason.PIN: 5,
}

#: A request's tail states, at its prompt's end: a later request that resends or extends the
#: prompt reads them, never the request itself.
TAIL_REASONS = frozenset({CheckpointReason.RESEND, CheckpointReason.EXTENSION})


def highest_retention(keys: Iterable[BlockHash], entries: Mapping[BlockHash, Entry]) -> int:
    """The highest retention among the entries of `keys`, 0 for none: a block's level, which
    the pool keeps as `Block.retention` and both the pool's and the policy's checks derive."""
    return max((RETENTION[entries[key].reason] for key in keys), default=0)


#: Each reason's string, for rows and events (an enum's `.value` is slow on hot paths).
REASON_VALUE = {reason: reason.value for reason in CheckpointReason}


@dataclass(slots=True)
class Entry:
    """Key `H_p` registered for one group, pointing at `block_id`.

    Only tokens before `position` are valid in the block; the entry is full when `position` is
    the block's end.
    """

    key: BlockHash
    block_id: int
    position: int
    reason: CheckpointReason
    key_hex: str = ""  # the key as events and rows spell it, made once

    def __post_init__(self) -> None:
        self.key_hex = self.key.hex()

    def is_full(self, block_size: int) -> bool:
        return self.position % block_size == 0
