"""How often each prefix recurred: a count per prefix hash of the requests whose prompts
passed it, learnt from the hash chains the cost-aware policy is shown at admission.

The table is a fixed array of counters indexed by the hash's low bits: prefixes that share a
slot share a count, so a count can only be too high (a state admitted that need not be), and
memory stays the same however long the engine runs. Counts along one chain never grow with
depth: every request that passed `H_p` passed every `H_q` before it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from engine.hashing import BlockHash

NUM_SLOTS = 1 << 16  # counters in the table (4 bytes each)


def slot(key: BlockHash, num_slots: int = NUM_SLOTS) -> int:
    """The counter `key` lands on: its first 8 bytes, reduced to the table (deterministic, so
    a run gives the same counts every time)."""
    return int.from_bytes(key[:8], "little") % num_slots


class RecurrenceCounts:
    """Per prefix hash, how many requests' prompts passed it (bounded; shared slots overcount)."""

    def __init__(self, num_slots: int = NUM_SLOTS) -> None:
        self.num_slots = num_slots
        self._counts = array("I", bytes(4 * num_slots))

    def observe(self, hashes: Sequence[BlockHash]) -> None:
        """One more request passed every hash of `hashes` (one prompt's chain)."""
        counts, num_slots = self._counts, self.num_slots
        for key in hashes:
            index = int.from_bytes(key[:8], "little") % num_slots
            if counts[index] < 0xFFFFFFFF:
                counts[index] += 1

    def count(self, key: BlockHash) -> int:
        """Requests whose prompts passed `key` (or a key sharing its slot). Changes nothing."""
        return self._counts[int.from_bytes(key[:8], "little") % self.num_slots]
