"""Where requests diverge: per prefix hash, how many requests' prompts passed it and how many
went no further with any earlier request, learnt from the hash chains a policy is shown at
admission (`reuse`'s Mamba pool: which states to write, and how long to keep one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from engine.hashing import BlockHash

MAX_TALLIED = 64  # divergence counts tallied one by one; those above count as one bucket
MIN_PAST = 3  # keys that went past a count before `expected_at` trusts it
MAX_KEYS = 1 << 16  # prefix hashes remembered: two generations of at most half as many


class Divergence(NamedTuple):
    """Where one prompt diverged: the deepest hash earlier prompts had passed, its index + 1
    in the prompt's chain, and whether some earlier prompt went on past it (a branch, where
    siblings part) rather than all of them ending there (a prompt extended, as a next turn
    extends the last)."""

    key: BlockHash
    length: int
    is_branch: bool


class DivergenceCounts:
    """Per prefix hash, how many requests' prompts passed it and how many diverged there: the
    deepest hash of the run, from the prompt's start, that earlier requests had passed.

    Exact per hash, not per slot of a table, so the counts follow the prompts' structure
    alone: a what-if replay, whose hashes are not the engine's, counts the same. Bounded: the
    hashes passed lately are kept in two generations of at most `MAX_KEYS / 2` each; a hash
    passed again moves to the current one, and when it is full the older generation is
    forgotten. A chain's hashes are all passed together, so the remembered hashes of any chain
    are a prefix of it (the run is found by bisection).

    A state at `p` pays only for the requests that diverge at or past `p` and before the next
    state of the chain: the ones that would resume from it. Where a prefix recurred but nobody
    diverged in that span (a 512 state under a 1024-token system prompt: every sibling goes on
    to 1024), a deeper state serves every reader, and this one is dead weight.

    How those counts ended up tells how many more a key will get (`expected_at`): the keys
    are tallied by count, so the share of keys that went from `n` divergences to `n + 1` is
    known. A family of eight siblings is done after its eighth; a popular system prompt, whose
    peers kept going, is not.
    """

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        # hash -> requests that passed it: those passed in this generation, and in the last
        self._current: dict[BlockHash, int] = {}
        self._previous: dict[BlockHash, int] = {}
        self._ends: dict[BlockHash, int] = {}  # hash -> requests that diverged there
        self._lasts: dict[BlockHash, int] = {}  # hash -> prompts whose chain ended there
        self._roots: set[BlockHash] = set()  # hashes first passed by a prompt sharing none
        self._tally = [0] * (MAX_TALLIED + 2)  # keys per divergence count (the last: more)
        self._expected: list[float | None] | None = None  # per count, until a count moves

    def observe(self, hashes: Sequence[BlockHash]) -> Divergence | None:
        """Count one more request passing every hash of `hashes`; returns where it diverged
        (that hash's count rose), None when no earlier request shared its first."""
        current, previous = self._current, self._previous
        low, high = 0, len(hashes)  # the run: the hashes passed before, a prefix of the chain
        while low < high:
            middle = (low + high) // 2
            if hashes[middle] in current or hashes[middle] in previous:
                low = middle + 1
            else:
                high = middle
        passed_before = self.count(hashes[low - 1]) if low else 0
        for key in hashes:
            count = current.get(key)
            if count is None:
                count = previous.pop(key, 0)
            current[key] = count + 1
        if hashes:
            self._lasts[hashes[-1]] = self._lasts.get(hashes[-1], 0) + 1
        if not low:  # it shared no hash with earlier prompts: a new family's first
            self._roots.update(hashes)
        if len(current) > self.max_keys // 2:  # a new generation: the older one is forgotten
            for key in previous:
                self._forget(key)
            self._previous, self._current = current, {}
        if not low:
            return None
        key = hashes[low - 1]
        before = self._ends.get(key, 0)
        self._ends[key] = before + 1
        self._move_tally(before, before + 1)
        ended = self._lasts.get(key, 0) - (low == len(hashes))  # not counting this prompt
        return Divergence(key, low, passed_before > ended)

    def _forget(self, key: BlockHash) -> None:
        self._lasts.pop(key, None)
        self._roots.discard(key)
        ends = self._ends.pop(key, 0)
        if ends:
            self._move_tally(ends, 0)

    def _move_tally(self, before: int, after: int) -> None:
        tally = self._tally
        if before:
            tally[min(before, MAX_TALLIED + 1)] -= 1
        if after:
            tally[min(after, MAX_TALLIED + 1)] += 1
        self._expected = None

    def count(self, key: BlockHash) -> int:
        """Requests whose prompts passed `key` (while remembered). Changes nothing."""
        count = self._current.get(key)
        return self._previous.get(key, 0) if count is None else count

    def is_root(self, key: BlockHash) -> bool:
        """Whether the first prompt that passed `key` (while remembered) shared no hash with
        any earlier prompt: a new family's first request, whose states are the only ones its
        siblings could resume from before one of them marks where they part. Changes
        nothing."""
        return key in self._roots

    def diverged_within(self, span: Sequence[BlockHash]) -> int:
        """Requests that diverged at a hash of `span`. Changes nothing."""
        ends = self._ends
        return sum(ends.get(key, 0) for key in span)

    def ends(self, key: BlockHash) -> int:
        """Requests that diverged at `key`. Changes nothing."""
        return self._ends.get(key, 0)

    def expected_at(self, count: int) -> float | None:
        """How many more requests will diverge at a key `count` did, judged by the keys that
        got as many: the sum over `m > count` of the share of them that reached `m`. None when
        fewer than `MIN_PAST` keys went past `count` (the families still going would make any
        estimate too low), past the tallied counts, or for 0. Changes nothing."""
        expected = self._expected
        if expected is None:
            expected = self._expected = self._tabulate()
        return expected[count]

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
