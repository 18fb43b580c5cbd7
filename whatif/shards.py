"""The sampled LRU curve that holds at 1%: SHARDS, with the shared prefixes counted exactly.

**Why plain SHARDS misses on LLM traffic.** SHARDS keeps a block iff its key hashes under
the rate, and each kept block stands for `1 / R` blocks. On prompt traffic a handful of keys
carry a large share of all hits: the blocks of a popular system prompt are read by every
request of its family, so at 1% one such block in the sample or out of it moves the whole
curve. On 100,000 requests of 300 families (a Zipf popularity) the top family's prompt is a
fifth of all requests; one of its blocks carries 15 points of hit rate at 1%, and eight
samples were off by up to 15 points (docs/benchmarks.md).

**What this estimator does instead.** A *family* is the requests that start with one root
block; a family of at least `HOT_SHARE` of the requests (and `HOT_MIN_REQUESTS`) has its
*prefix*, the blocks every one of its requests shares (its longest common prefix, found by a
binary search over the keys, which chain). Those prefixes are few keys read very often;
everything else (conversation histories, questions, the prompts of rare families) is many keys
read a few times each, where sampling is accurate. So:

- The rest is sampled as SHARDS does (rate `R`, by key), and its distances found in one pass
  over the sample (`curves.distances_and_users`), in sampled blocks, scaled by `1 / R`.
- A prefix is counted exactly, for every request of its family. Request `r`'s prefix block
  `k` was last used by the family's previous request `s`, which used blocks `k - 1 .. 0` after
  it (the root last), so its distance is `D_r + k`, with `D_r` the distinct blocks used by the
  requests strictly between `s` and `r`. At size `C` it hits the `ceil(C - D_r)` first prefix
  blocks (within its prefix, and its prompt's cap).
- `D_r`, and the distance of a sampled block, count the prefixes used inside their window
  exactly: a window's distinct prefix blocks are the prefixes of the families with a request
  in it, each once (`_Windows`, a dominance sum over the families' requests). Its distinct
  sampled blocks are its sampled uses less the expected repeats (a use whose key was used
  earlier in the same window, from the sample's own reuse gaps).

The hit tokens are the prefixes' (exact) plus the sample's, scaled by the share of the other
prompt-block tokens the sample kept. Measured against the exact curve in `benchmarks/whatif.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from whatif.curves import (
    BlockStream,
    Curve,
    distances_and_users,
    sampled_positions,
    starts_of,
)

HOT_SHARE = 0.001  # a family of at least this share of the requests has its prefix counted,
HOT_MIN_REQUESTS = 100  # and of at least this many (below, sampling it whole is accurate)


class Families(NamedTuple):
    """The hot families of a block stream and their shared prefixes."""

    members: np.ndarray  # int64: the requests of hot families, in request order
    family: np.ndarray  # int64: each member's family, 0 .. num_families - 1
    prefix: np.ndarray  # int64 [requests]: blocks of the request's family prefix (0: none)
    lengths: np.ndarray  # int64 [num_families]: each family's prefix, in blocks
    by_family: np.ndarray  # int64: the members' positions, by family, then request


def hot_families(stream: BlockStream, min_count: int) -> Families:
    """The families of at least `min_count` requests and each one's prefix: the longest run of
    leading blocks all its requests share. Keys chain, so two requests share `n` blocks iff
    their `n`-th keys are equal: one binary search per family over its requests at once. Pure."""
    keys, starts = stream.keys, stream.starts
    lengths = np.diff(starts)
    requests = np.flatnonzero(lengths > 0)
    roots = keys[starts[requests]]
    _, first, inverse, counts = np.unique(
        roots, return_index=True, return_inverse=True, return_counts=True
    )
    hot = np.flatnonzero(counts >= min_count)
    index = np.full(len(counts), -1, np.int64)
    index[hot] = np.arange(len(hot))
    is_member = index[inverse] >= 0
    members, family = requests[is_member], index[inverse[is_member]]
    reference = requests[first[hot]]
    by_family = np.argsort(family, kind="stable")
    group_starts = np.flatnonzero(np.diff(family[by_family], prepend=-1))
    if not len(hot):
        return Families(members, family, np.zeros(stream.num_requests, np.int64), hot, by_family)
    shortest = np.minimum.reduceat(lengths[members[by_family]], group_starts)
    # the prefix the reference shares with the family's last member, then checked on all
    last = np.zeros(len(hot), np.int64)
    last[family] = members
    ids = np.arange(len(hot))
    prefix = _shared(keys, starts, last, ids, reference, np.ones(len(hot), np.int64), shortest)
    at = prefix[family] - 1
    agrees = keys[starts[members] + at] == keys[starts[reference[family]] + at]
    wrong = np.bincount(family, ~agrees, len(hot)) > 0
    if wrong.any():
        inside = wrong[family]
        low, high = np.ones(len(hot), np.int64), np.where(wrong, prefix, 1)
        again = _shared(keys, starts, members[inside], family[inside], reference, low, high)
        prefix = np.where(wrong, again, prefix)
    per_request = np.zeros(stream.num_requests, np.int64)
    per_request[members] = prefix[family]
    return Families(members, family, per_request, prefix, by_family)


def _shared(keys, starts, requests, family, reference, low, high) -> np.ndarray:
    """Per family, the most leading blocks in `[low, high]` every one of `requests` (of
    `family`) shares with the family's `reference` request (at least `low`)."""
    num = len(low)
    while np.any(low < high):
        middle = (low + high + 1) // 2
        at = middle[family] - 1
        same = keys[starts[requests] + at] == keys[starts[reference[family]] + at]
        differs = np.bincount(family, ~same, num) > 0
        low, high = np.where(differs, low, middle), np.where(differs, middle - 1, high)
    return low


def family_shards_curve(
    stream: BlockStream, sizes: Sequence[int], rate: float, seed: int = 0
) -> Curve:
    """The LRU curve estimated from a `rate` sample of the blocks outside the hot families'
    prefixes, the prefixes counted exactly (the module docstring says how). Pure."""
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
    min_count = max(HOT_MIN_REQUESTS, math.ceil(HOT_SHARE * stream.num_requests))
    families = hot_families(stream, min_count)
    sample, request = _sample_outside(stream, families.prefix, rate, seed)
    sample_starts = starts_of(request, stream.num_requests)
    distances, _, last_user = distances_and_users(stream.keys[sample], sample_starts)
    previous = _previous_members(families)
    follows = previous >= 0  # members with an earlier one of their family
    seen = distances >= 0  # sampled blocks used before
    # the prefixes used since a sampled block's last use: its last user's own (its root last,
    # after the block) and those of the requests between; since a member's previous one: those
    # of the requests between
    in_sample, in_prefix = _Windows(families, previous, stream.num_requests).blocks(
        (last_user[seen], request[seen]), (previous[follows] + 1, families.members[follows])
    )
    totals = _prompt_block_tokens(stream)
    sizes = np.asarray(sizes, np.int64)
    sampled = _sampled_hits(stream, families, sample, distances / rate, in_sample, rate,
                            totals, sizes)  # fmt: skip
    prefixes = _prefix_hits(stream, families, previous, in_prefix, sample_starts, request,
                            last_user, rate, totals, sizes)  # fmt: skip
    return Curve(sizes, sampled + prefixes, stream.num_prompt_tokens)


def _sample_outside(
    stream: BlockStream, prefix: np.ndarray, rate: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the blocks SHARDS keeps at `rate` outside the family prefixes, and
    the request of each."""
    kept = sampled_positions(stream.keys, rate, seed)
    request = np.searchsorted(stream.starts, kept, "right") - 1
    outside = kept - stream.starts[request] >= prefix[request]
    return kept[outside], request[outside]


def _prompt_block_tokens(stream: BlockStream) -> np.ndarray:
    """Each request's hit-able tokens, all its blocks held: a hit on its first `n` blocks is
    `min(n * Ba, total)` (only full prompt blocks hit, up to the cap)."""
    totals = np.zeros(stream.num_requests, np.int64)
    has = np.diff(stream.starts) > 0
    if has.any():
        totals[has] = np.add.reduceat(stream.weights, stream.starts[:-1][has])
    return totals


class _Windows:
    """The distinct prefix blocks a window of requests uses, counted exactly.

    A hot family's requests all use its whole prefix, and families' prefixes share no key, so
    the prefix blocks used by the requests in `[low, high)` are the prefix lengths of the
    families with a request there, each once: the members below `high` whose previous member
    (of their family) is below `low`, less the members below `low` (whose previous ones are
    too). An expectation from each family's gaps in place of the count was 2 to 4 points above
    the exact curve on 20 families of long prompts: the hit is not linear in it."""

    def __init__(self, families: Families, previous: np.ndarray, num_requests: int) -> None:
        members, family = families.members, families.family
        by_previous = np.argsort(previous, kind="stable")
        self.previous = previous[by_previous]
        self.members = members[by_previous]
        self.weights = families.lengths[family][by_previous]
        self.num_requests = num_requests
        before = np.bincount(members + 1, families.lengths[family], num_requests + 1)
        self.before = np.cumsum(before)  # [p]: the members' prefixes below request p

    def blocks(self, *windows: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
        """For each `(low, high)` pair of arrays, the distinct prefix blocks used by the
        requests in each `[low, high)` (0 where empty); all answered in one walk."""
        stride = self.num_requests + 1
        keyed = [low * stride + np.maximum(high, low) for low, high in windows]
        # one query per window: a request's sampled blocks mostly share theirs
        unique, each = np.unique(np.concatenate(keyed), return_inverse=True)
        low, high = np.divmod(unique, stride)
        count = np.searchsorted(self.previous, low, "left")  # members whose previous < low
        found = (_weights_below(self.members, self.weights, count, high) - self.before[low])[each]
        return np.split(found, np.cumsum([len(k) for k in keyed])[:-1])


def _previous_members(families: Families) -> np.ndarray:
    """Each member's previous request of its family (-1 for a family's first)."""
    members, family, order = families.members, families.family, families.by_family
    previous = np.full(len(members), -1, np.int64)
    same = family[order[1:]] == family[order[:-1]]
    previous[order[1:][same]] = members[order[:-1][same]]
    return previous


def _weights_below(values: np.ndarray, weights: np.ndarray, count: np.ndarray,
                   bound: np.ndarray) -> np.ndarray:  # fmt: skip
    """For each query i, the sum of `weights` over the first `count[i]` of `values` (ints in
    `[0, 2^63)`) that are below `bound[i]`: a wavelet matrix walked level by level as it is
    built (one stable split by each bit of the values, high bit first), so each level costs a
    few passes over the values and the queries, and nothing is kept between levels."""
    sums = np.zeros(len(count))
    start, end = np.zeros(len(count), np.int64), np.asarray(count, np.int64)
    for bit in reversed(
        range(max(int(values.max(initial=0)), int(bound.max(initial=0))).bit_length())
    ):
        is_one = (values >> bit) & 1 == 1
        zeros = np.concatenate(([0], np.cumsum(~is_one)))  # [i]: zero bits among the first i
        zero_weights = np.concatenate(([0.0], np.cumsum(np.where(is_one, 0.0, weights))))
        num_zeros = zeros[-1]
        goes_right = (bound >> bit) & 1 == 1
        # a query whose bound has a 1 here takes every value with a 0 here, then follows its 1s
        sums += np.where(goes_right, zero_weights[end] - zero_weights[start], 0.0)
        start = np.where(goes_right, num_zeros + start - zeros[start], zeros[start])
        end = np.where(goes_right, num_zeros + end - zeros[end], zeros[end])
        split = np.concatenate((np.flatnonzero(~is_one), np.flatnonzero(is_one)))
        values, weights = values[split], weights[split]
    return sums


def _sampled_hits(stream, families, sample, scaled, prefixes, rate, totals, sizes) -> np.ndarray:
    """Hit tokens of the sampled blocks at each size: distances in blocks (`scaled`: the
    sampled ones over the rate, -1 for a first use, plus `prefixes`: those used since, for
    each block used before), tokens scaled by the share of the non-prefix prompt-block tokens
    the sample kept."""
    seen = scaled >= 0
    blocks = scaled[seen] + prefixes
    tokens = stream.weights[sample][seen].astype(np.float64)
    order = np.argsort(blocks, kind="stable")
    blocks, cumulated = blocks[order], np.concatenate(([0.0], np.cumsum(tokens[order])))
    hits = cumulated[np.searchsorted(blocks, sizes, "left")]
    members = families.members
    prefix_tokens = np.minimum(families.prefix[members] * stream.block_size, totals[members])
    outside = int(stream.weights.sum()) - int(prefix_tokens.sum())
    kept = float(stream.weights[sample].sum())
    return hits / (kept / outside) if kept and outside else hits


def _prefix_hits(
    stream, families, previous, others, sample_starts, request_of, last_user, rate, totals, sizes
) -> np.ndarray:
    """Hit tokens of the family prefixes at each size, request by request: `r` hits the first
    `ceil(C - D_r)` blocks of its prefix, `D_r` the distinct blocks of the requests between
    it and its family's previous request (`others`: their prefixes', for each member that has
    a previous one)."""
    follows = previous >= 0
    now, then, ids = families.members[follows], previous[follows], families.family[follows]
    window = now - then - 1
    # the window's distinct sampled blocks: its uses less the expected repeats, from the gaps
    gaps = (request_of - last_user)[last_user >= 0]
    per_request = np.bincount(gaps, minlength=stream.num_requests + 1) / stream.num_requests
    count, weighted = np.cumsum(per_request), np.cumsum(per_request * np.arange(len(per_request)))
    span = np.clip(window, 0, len(per_request) - 1)
    repeats = span * count[span] - weighted[span]
    uses = sample_starts[now] - sample_starts[then + 1]
    base = np.maximum(uses - repeats, 0.0) / rate + others
    # a hit on the first n blocks is min(n * Ba, total) = Ba * min(n, total / Ba)
    most = np.minimum(families.lengths[ids], totals[now] / stream.block_size)
    hits = np.empty(len(sizes))
    for index, size in enumerate(sizes.tolist()):
        blocks = np.ceil(size - base)
        hits[index] = np.clip(blocks, 0.0, most, out=blocks).sum()
    return hits * stream.block_size
