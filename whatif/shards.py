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
- `D_r`, and the distance of a sampled block, take the prefixes used inside their window into
  account. A window's distinct sampled blocks are its sampled uses less the expected repeats (a
  use whose key was used earlier in the same window, from the sample's own reuse gaps); its
  distinct prefix blocks are each family's prefix length times the share of windows of that
  length that hold one of its requests, counted from the family's own gaps (a family's requests
  come in bursts, conversations, so fewer windows hold it than independent draws would), plus
  the prefix of the request that used a sampled block last.

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
_GRID_POINTS = 400  # window lengths at which each family's presence is tabulated


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
    presence = _Presence(families, stream.num_requests)
    totals = _prompt_block_tokens(stream)
    sizes = np.asarray(sizes, np.int64)
    sampled = _sampled_hits(stream, families, presence, sample, distances, request,
                            last_user, rate, totals, sizes)  # fmt: skip
    prefixes = _prefix_hits(stream, families, presence, sample_starts, request, last_user,
                            rate, totals, sizes)  # fmt: skip
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


class _Presence:
    """For a window of `g` requests: the distinct prefix blocks it is expected to use, and each
    family's share of windows holding one of its requests (from the family's gaps)."""

    def __init__(self, families: Families, num_requests: int) -> None:
        self.lengths = families.lengths
        top = max(num_requests, 2)
        self.grid = np.unique(np.round(np.geomspace(1, top, _GRID_POINTS)).astype(np.int64))
        self.share = np.zeros((len(self.grid), len(families.lengths)))
        order = families.by_family
        family, members = families.family[order], families.members[order]
        bounds = np.flatnonzero(np.diff(family)) + 1
        for ids, requests in zip(np.split(family, bounds), np.split(members, bounds), strict=True):
            if len(ids) == 0:
                continue
            # windows of g free of the family: over the runs between its requests, (gap - g)^+
            gaps = np.sort(np.diff(np.concatenate(([-1], requests, [num_requests]))))
            above = np.searchsorted(gaps, self.grid, "right")
            tail = np.concatenate((np.cumsum(gaps[::-1])[::-1], [0]))[above]
            free = tail - self.grid * (len(gaps) - above)
            self.share[:, ids[0]] = np.clip(1.0 - free / num_requests, 0.0, 1.0)
        self.blocks = self.share @ self.lengths.astype(np.float64)

    def expected_blocks(self, windows: np.ndarray) -> np.ndarray:
        """Distinct prefix blocks used in windows of `windows` requests (0 for none)."""
        log_grid = np.log(self.grid)
        found = np.interp(np.log(np.maximum(windows, 1)), log_grid, self.blocks)
        return np.where(windows > 0, found, 0.0)

    def family_share(self, family: np.ndarray, windows: np.ndarray) -> np.ndarray:
        at = np.clip(np.searchsorted(self.grid, np.maximum(windows, 1)), 0, len(self.grid) - 1)
        return np.where(windows > 0, self.share[at, family], 0.0)


def _sampled_hits(
    stream, families, presence, sample, distances, request_of, last_user, rate, totals, sizes
) -> np.ndarray:
    """Hit tokens of the sampled blocks at each size: distances in blocks (sampled ones scaled,
    the prefixes used in the window and the last user's own added), tokens scaled by the share
    of the non-prefix prompt-block tokens the sample kept."""
    seen = distances >= 0
    user = last_user[seen]
    window = request_of[seen] - user - 1
    family_of = np.full(stream.num_requests, -1, np.int64)
    family_of[families.members] = families.family
    users_family = family_of[user]
    is_hot = users_family >= 0
    own = np.zeros(len(user))  # the last user's own prefix, used after the block
    if is_hot.any():
        hot_family, hot_window = users_family[is_hot], window[is_hot]
        share = presence.family_share(hot_family, hot_window)
        own[is_hot] = families.lengths[hot_family] * (1.0 - share)
    blocks = distances[seen] / rate + presence.expected_blocks(window) + own
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
    stream, families, presence, sample_starts, request_of, last_user, rate, totals, sizes
) -> np.ndarray:
    """Hit tokens of the family prefixes at each size, request by request: `r` hits the first
    `ceil(C - D_r)` blocks of its prefix, `D_r` the distinct blocks of the requests between
    it and its family's previous request."""
    members, family, order = families.members, families.family, families.by_family
    follows = np.zeros(len(members), bool)
    follows[order[1:]] = family[order[1:]] == family[order[:-1]]
    previous = np.full(len(members), -1, np.int64)
    previous[order[1:]] = members[order[:-1]]
    now, then, ids = members[follows], previous[follows], family[follows]
    window = now - then - 1
    # the window's distinct sampled blocks: its uses less the expected repeats, from the gaps
    gaps = (request_of - last_user)[last_user >= 0]
    per_request = np.bincount(gaps, minlength=stream.num_requests + 1) / stream.num_requests
    count, weighted = np.cumsum(per_request), np.cumsum(per_request * np.arange(len(per_request)))
    span = np.clip(window, 0, len(per_request) - 1)
    repeats = span * count[span] - weighted[span]
    uses = sample_starts[now] - sample_starts[then + 1]
    others = presence.expected_blocks(window) - families.lengths[ids] * presence.family_share(
        ids, window
    )
    base = np.maximum(uses - repeats, 0.0) / rate + np.maximum(others, 0.0)
    # a hit on the first n blocks is min(n * Ba, total) = Ba * min(n, total / Ba)
    most = np.minimum(families.lengths[ids], totals[now] / stream.block_size)
    hits = np.empty(len(sizes))
    for index, size in enumerate(sizes.tolist()):
        blocks = np.ceil(size - base)
        hits[index] = np.clip(blocks, 0.0, most, out=blocks).sum()
    return hits * stream.block_size
