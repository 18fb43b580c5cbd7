"""Where requests diverge: per prefix hash, how many requests' prompts passed it and how many
went no further with any earlier request, learnt from the hash chains a policy is shown at
admission (`reuse`'s Mamba pool: which states to write, and how long to keep one).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from engine.cache.eviction.recurrence import NUM_SLOTS, RecurrenceCounts
from engine.hashing import BlockHash

MAX_TALLIED = 64  # divergence counts tallied one by one; those above count as one bucket
MIN_PAST = 3  # keys that went past a count before `expected_more` trusts it


class DivergenceCounts(RecurrenceCounts):
    """Recurrence counts plus, per prefix hash, how many requests diverged there: the deepest
    hash of the run, from the prompt's start, that earlier requests had passed (bounded the
    same way).

    A state at `p` pays only for the requests that diverge at or past `p` and before the next
    state of the chain: the ones that would resume from it. Where a prefix recurred but nobody
    diverged in that span (a 512 state under a 1024-token system prompt: every sibling goes on
    to 1024), a deeper state serves every reader, and this one is dead weight.

    How those counts ended up tells how many more a key will get (`expected_more`): the slots
    are tallied by count, so the share of keys that went from `n` divergences to `n + 1` is
    known. A family of eight siblings is done after its eighth; a popular system prompt, whose
    peers kept going, is not.
    """

    def __init__(self, num_slots: int = NUM_SLOTS) -> None:
        super().__init__(num_slots)
        self._ends = array("I", bytes(4 * num_slots))
        self._tally = [0] * (MAX_TALLIED + 2)  # slots per divergence count (the last: more)
        self._expected: list[float | None] | None = None  # per count, until a count moves

    def observe(self, hashes: Sequence[BlockHash]) -> None:
        counts, num_slots = self._counts, self.num_slots
        shared = None  # the slot of the deepest hash of the run of passed ones from the start
        in_run = True  # forward: a stray shared slot past the run cannot count
        for key in hashes:
            index = int.from_bytes(key[:8], "little") % num_slots
            count = counts[index]
            if in_run:
                if count:
                    shared = index
                else:
                    in_run = False
            if count < 0xFFFFFFFF:
                counts[index] = count + 1
        if shared is not None and self._ends[shared] < 0xFFFFFFFF:
            before = self._ends[shared]
            self._ends[shared] = before + 1
            if before:
                self._tally[min(before, MAX_TALLIED + 1)] -= 1
            self._tally[min(before + 1, MAX_TALLIED + 1)] += 1
            self._expected = None

    def diverged_within(self, span: Sequence[BlockHash]) -> int:
        """Requests that diverged at a hash of `span` (or one sharing its slot). Changes
        nothing."""
        ends, num_slots = self._ends, self.num_slots
        return sum(ends[int.from_bytes(key[:8], "little") % num_slots] for key in span)

    def expected_more(self, key: BlockHash) -> float | None:
        """How many more requests will diverge at `key`, judged by the keys that got as many:
        the sum over `m > n` of the share of them that reached `m`, where `n` is its count. None
        when nobody diverged there yet, or when fewer than `MIN_PAST` keys went past `n` (the
        families still going would make any estimate too low). Changes nothing."""
        ends = self._ends[int.from_bytes(key[:8], "little") % self.num_slots]
        if not ends:
            return None
        expected = self._expected
        if expected is None:
            expected = self._expected = self._tabulate()
        return expected[min(ends, MAX_TALLIED + 1)]

    def _tabulate(self) -> list[float | None]:
        tally = self._tally
        reached = [0] * (len(tally) + 1)  # keys whose count reached n
        for count in range(len(tally) - 1, 0, -1):
            reached[count] = reached[count + 1] + tally[count]
        expected: list[float | None] = [None] * len(tally)
        for count in range(1, len(tally) - 1):
            if reached[count + 1] >= MIN_PAST:
                expected[count] = sum(reached[count + 1 : -1]) / reached[count]
        return expected
