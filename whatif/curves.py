"""Miss-ratio curves of a recording: the hit rate each cache size would have given.

**The LRU curve, in one pass.** LRU has the stack property (Mattson et al., 1970): a cache of
`C` blocks holds the `C` most recently used keys, so one pass that finds every access's stack
distance (the distinct keys used since that key was last used) gives the hits at every size
at once. The model is the attention group alone, at block granularity:

- A request's blocks are the full attention blocks (`Ba` tokens, a multiple of the recording's
  unit `U`) of its prompt and output; block `k`'s key is the chain hash at the block's last unit.
- Its hit is the leading prompt blocks the cache holds when it arrives, times `Ba`, capped at
  `P - 1` floored to `U` (a hit never covers the whole prompt; only full prompt blocks count).
- Then every one of its blocks is used, deepest first and the root last, and the cache keeps
  the `C` most recent. A parent is then always more recent than its child, so the held blocks
  of a chain are its leading ones and the hit at size `C` is the leading prompt blocks whose
  stack distance is below `C`: a histogram of distances weighted by tokens, cumulated.
- Requests run one after another (no concurrency), pins are left out, nothing is pinned.

**How the pass is fast.** Keys chain, so the request that last used a request's block `k`
used its blocks `0..k` too, and the last users along a chain only get older with depth: the
chain splits into a few *runs* of blocks last used by one earlier request (a shared system
prompt, the previous turn, new blocks). Within the run of blocks last used by `s`, block `k`'s
distance is the blocks request `s` used after it (`k - first block of the run`: `s` used the
root last) plus the blocks still last used by requests between `s` and now. That count is a
sum over requests less the blocks later runs took from them: a 2-D dominance sum, done offline
for all runs at once (`_dominance_sums`). The work is a sort of the block keys and
O(runs log^2 runs) in numpy; no per-block Python.

**SHARDS** (Waldspurger et al., FAST '15), fixed rate: keep a block iff its key, mixed again,
falls below `R * 2^24` in the top 24 bits; the same pass on the kept blocks gives distances
in sampled blocks, and a sampled distance `d` stands for the real distances `[d, d + 1) / R`
(spread evenly). Hit tokens are the kept blocks' tokens scaled by the share of all
prompt-block tokens the sample kept (the ratio estimator; SHARDS-adj corrects the same
deviation of the sample's size). Its error is a random variable with a heavy tail on LLM
traffic: a popular system prompt's few dozen blocks carry a large share of all hits, and 1%
of them is less than one block, in the sample or not (docs/benchmarks.md has the figures).
`whatif.shards` counts those shared prefixes exactly and samples the rest: within a
point at 1%.

**Other policies** (`reuse`, `retention`, `cost`, and the hybrid hit with Mamba states) have
no stack property: a point of their curve is a real replay (`whatif.run`) of a sample
of the recording's prefix families (by first unit, so a family is kept or dropped whole) with
the memory scaled by the share of the traffic it kept, corrected by the exact LRU curve as a
control variate (`policy_curve`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal, NamedTuple

import numpy as np

from engine.config import CacheConfig, SchedulerConfig
from engine.events import ATTENTION, MAMBA
from engine.scheduling.capacity import blocks_needed
from whatif.recording import RecordedRequest, Recording

_MASK64 = (1 << 64) - 1
_SAMPLE_BITS = 24  # SHARDS' modulus P = 2^24: a key is kept iff its mixed top 24 bits < R * P
_SAMPLE_SALT = np.uint64(0x5A4D_5EED_C0FF_EE01)  # apart from `_spread`'s mixing
_GOLDEN = np.uint64(0x9E37_79B9_7F4A_7C15)


@dataclass(frozen=True)
class BlockStream:
    """Every attention block of every request, request by request in arrival order, each
    request's blocks root first."""

    keys: np.ndarray  # uint64 [n]: the chain hash at the block's last unit
    starts: np.ndarray  # int64 [requests + 1]: request r's blocks are [starts[r], starts[r+1])
    weights: np.ndarray  # int64 [n]: prompt tokens a hit on the block adds (0: output, past cap)
    num_prompt_tokens: int  # every request's prompt, hit or not: the curve's denominator
    block_size: int  # Ba, in tokens

    @property
    def num_requests(self) -> int:
        return len(self.starts) - 1


def block_stream(recording: Recording, block_size: int | None = None) -> BlockStream:
    """The blocks of `recording`'s requests (pins left out) at `block_size` tokens (default:
    the attention block it ran with). Reads the recording; changes nothing."""
    unit = recording.unit
    if block_size is None:
        geometry = recording.geometry
        block_size = geometry.attention_block_size or geometry.block_size or unit
    if block_size % unit:
        raise ValueError(
            f"block size {block_size} is not a multiple of the recording's unit {unit}"
        )
    step = block_size // unit
    requests = [r for r in recording.requests if not r.pin]
    counts = np.fromiter((len(r.units) // step for r in requests), np.int64, len(requests))
    starts = np.zeros(len(requests) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    chains = (r.units[step - 1 :: step] for r in requests)
    try:
        keys = np.fromiter(chain.from_iterable(chains), np.uint64, int(starts[-1]))
    except OverflowError:  # signed or wider hashes: only equality matters, keep 64 bits
        chains = (r.units[step - 1 :: step] for r in requests)
        masked = (u & _MASK64 for u in chain.from_iterable(chains))
        keys = np.fromiter(masked, np.uint64, int(starts[-1]))
    prompts = np.fromiter((r.num_prompt_tokens for r in requests), np.int64, len(requests))
    caps = np.maximum(prompts - 1, 0) // unit * unit  # a hit never covers the whole prompt
    depth = np.arange(len(keys)) - np.repeat(starts[:-1], counts)
    prompt_of, cap_of = np.repeat(prompts, counts), np.repeat(caps, counts)
    weights = np.minimum((depth + 1) * block_size, cap_of) - np.minimum(depth * block_size, cap_of)
    weights[(depth + 1) * block_size > prompt_of] = 0  # only full prompt blocks hit
    return BlockStream(keys, starts, weights, int(prompts.sum()), block_size)


class Curve(NamedTuple):
    """Hit tokens against cache size; `hit_rates` is the curve."""

    sizes: np.ndarray  # int64: cache sizes in attention blocks
    hit_tokens: np.ndarray  # float64: prompt tokens hit at each size (an estimate when sampled)
    num_prompt_tokens: int  # the denominator: every prompt token of the recording

    @property
    def hit_rates(self) -> np.ndarray:
        return self.hit_tokens / max(self.num_prompt_tokens, 1)


def stack_distances(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each block's LRU stack distance when its request arrives, before that request used
    anything: the distinct keys used since the key's last use (int64, -1 for a first use).
    Within a request the blocks must be one chain, root first (distinct keys). Pure."""
    return distances_and_users(keys, starts)[0]


def distances_and_users(
    keys: np.ndarray, starts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`stack_distances`, with each block's request and the earlier request that used its key
    last (-1: none). Pure."""
    n, num_requests = len(keys), len(starts) - 1
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    request_of = np.repeat(np.arange(num_requests), np.diff(starts))
    last_user = _last_users(keys, request_of)
    if np.any(last_user == request_of):
        raise ValueError("a request uses one block key twice: its blocks are not one chain")
    # runs: a request's consecutive blocks that one earlier request (or none) used last
    is_first = np.ones(n, bool)
    is_first[1:] = (last_user[1:] != last_user[:-1]) | (request_of[1:] != request_of[:-1])
    run_starts = np.flatnonzero(is_first)
    run_lengths = np.diff(np.append(run_starts, n))
    run_request, run_user = request_of[run_starts], last_user[run_starts]
    old = run_user >= 0
    now, then, taken = run_request[old], run_user[old], run_lengths[old]
    # blocks still last used by requests strictly between `then` and `now`: all they used,
    # less what runs of requests before `now` took from them since
    used_between = starts[now] - starts[then + 1]
    bases = np.full(len(run_starts), -1, np.int64)
    bases[old] = used_between - _dominance_sums(now, then, taken, now, then)
    run_of = np.cumsum(is_first) - 1
    base = bases[run_of]
    # request `then` used the run's shallower blocks after this one (it used the root last)
    distances = base + (np.arange(n) - run_starts[run_of])
    distances[base < 0] = -1
    return distances, request_of, last_user


def lru_curve(stream: BlockStream, sizes: Sequence[int]) -> Curve:
    """The exact LRU curve at `sizes` (attention blocks), in one pass. Pure."""
    distances = stack_distances(stream.keys, stream.starts)
    return _curve(distances, stream.weights, sizes, 1.0, 1.0, stream.num_prompt_tokens)


def sample_stream(stream: BlockStream, rate: float, seed: int = 0) -> BlockStream:
    """SHARDS' spatial sample: the blocks whose mixed key falls under `rate` (`seed` picks
    another mix, so another sample of the same rate). Pure."""
    kept = sampled_positions(stream.keys, rate, seed)
    starts = starts_of(np.searchsorted(stream.starts, kept, "right") - 1, stream.num_requests)
    keys, weights = stream.keys[kept], stream.weights[kept]
    return BlockStream(keys, starts, weights, stream.num_prompt_tokens, stream.block_size)


def sampled_positions(keys: np.ndarray, rate: float, seed: int = 0) -> np.ndarray:
    """The positions of the keys SHARDS keeps at `rate` (all of them at 1). Pure."""
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
    threshold = round(rate * (1 << _SAMPLE_BITS))
    if threshold >= 1 << _SAMPLE_BITS:
        return np.arange(len(keys))
    return _kept(keys, _salt(seed), np.uint64(threshold << (64 - _SAMPLE_BITS)))


def starts_of(request_of: np.ndarray, num_requests: int) -> np.ndarray:
    """Each request's first position in a stream whose positions belong to `request_of`
    (non-decreasing), and the end: `starts[r]` to `starts[r + 1]`. Pure."""
    starts = np.zeros(num_requests + 1, np.int64)
    np.cumsum(np.bincount(request_of, minlength=num_requests), out=starts[1:])
    return starts


def shards_curve(stream: BlockStream, sizes: Sequence[int], rate: float, seed: int = 0) -> Curve:
    """The LRU curve estimated from a `rate` spatial sample of the blocks (SHARDS). Pure."""
    sample = sample_stream(stream, rate, seed)
    distances = stack_distances(sample.keys, sample.starts)
    total = int(stream.weights.sum())
    # the ratio estimator's rate: the share of prompt-block tokens the sample kept
    share = (int(sample.weights.sum()) / total if total else 0.0) or 1.0
    return _curve(distances, sample.weights, sizes, rate, share, stream.num_prompt_tokens)


def _kept(keys: np.ndarray, salt: np.uint64, bound: np.uint64) -> np.ndarray:
    """The positions of the keys whose mix falls under `bound` (the top 24 bits under the
    threshold: the whole word under it shifted up), a cache-sized chunk at a time (twice as
    fast as whole arrays over millions of keys)."""
    chunk = 1 << 18
    mixed = np.empty(min(chunk, len(keys)), np.uint64)
    found = []
    for start in range(0, len(keys), chunk):
        part = keys[start : start + chunk]
        out = mixed[: len(part)]
        np.bitwise_xor(part, salt, out=out)  # the chain hash is a hash: one more mix
        out *= _GOLDEN
        found.append(np.flatnonzero(out < bound) + start)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _salt(seed: int) -> np.uint64:
    return np.uint64((int(_SAMPLE_SALT) + seed * 0x9E37_79B9) & _MASK64)


def default_sizes(stream: BlockStream, num_points: int = 24) -> np.ndarray:
    """`num_points` cache sizes, geometric from 1 block to every distinct block of `stream`."""
    working_set = max(len(np.unique(stream.keys)), 1)
    grid = np.geomspace(1, working_set, num_points)
    return np.unique(np.round(grid).astype(np.int64))


def _curve(
    distances: np.ndarray,
    weights: np.ndarray,
    sizes: Sequence[int],
    distance_rate: float,
    token_rate: float,
    num_prompt_tokens: int,
) -> Curve:
    """Hit tokens at each size: the tokens of blocks whose distance, scaled by
    `1 / distance_rate`, is below the size, scaled by `1 / token_rate`."""
    sizes = np.asarray(sizes, np.int64)
    hit = (distances >= 0) & (weights > 0)
    histogram = np.bincount(distances[hit], weights[hit].astype(np.float64))
    cumulated = np.concatenate(([0.0], np.cumsum(histogram)))
    # a sampled distance d stands for the real distances [d / rate, (d + 1) / rate), spread
    # evenly: at size C it counts for the part of that span below C (all of it when exact)
    reach = sizes * distance_rate
    whole = np.clip(np.floor(reach).astype(np.int64), 0, len(histogram))
    part = np.where(whole < len(histogram), reach - whole, 0.0)
    tokens = cumulated[whole] + part * np.append(histogram, 0.0)[whole]
    return Curve(sizes, tokens / token_rate, num_prompt_tokens)


def _last_users(keys: np.ndarray, request_of: np.ndarray) -> np.ndarray:
    """For each block, the last earlier request that used its key (-1: none).

    One `np.sort` of the mixed key's high bits packed with the position (an argsort costs
    about ten times more); the rare stretches where two keys share those high bits are
    sorted again by the whole key."""
    n = len(keys)
    bits = max(int(n - 1).bit_length(), 1)
    low = np.uint64((1 << bits) - 1)
    spread = _spread(keys)  # a bijection: equal keys stay equal, small keys spread
    packed = (spread & ~low) | np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & low).astype(np.int64)
    whole = spread[order]
    high_equal = (packed[1:] >> np.uint64(bits)) == (packed[:-1] >> np.uint64(bits))
    if np.any(high_equal & (whole[1:] != whole[:-1])):
        stretch = np.concatenate(([0], np.cumsum(~high_equal)))
        mixed = np.isin(stretch, stretch[1:][high_equal & (whole[1:] != whole[:-1])])
        inside = np.flatnonzero(mixed)
        resort = np.lexsort((order[inside], whole[inside], stretch[inside]))
        order[inside] = order[inside][resort]
        whole = spread[order]
    same = whole[1:] == whole[:-1]
    last = np.full(n, -1, np.int64)
    last[order[1:][same]] = request_of[order[:-1][same]]
    return last


def _spread(keys: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every input bit."""
    z = keys ^ (keys >> np.uint64(30))
    z = z * np.uint64(0xBF58_476D_1CE4_E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D0_49BB_1331_11EB)
    return z ^ (z >> np.uint64(31))


def _argsort_ints(values: np.ndarray, bits: int) -> np.ndarray:
    """The stable argsort of non-negative ints below `2^bits`, by one `np.sort` of the
    values packed above their positions when both fit in 63 bits."""
    n = len(values)
    position_bits = max(int(n - 1).bit_length(), 1)
    if bits + position_bits > 63:
        return np.argsort(values, kind="stable")
    packed = (values.astype(np.int64) << position_bits) | np.arange(n, dtype=np.int64)
    packed.sort()
    return packed & ((1 << position_bits) - 1)


def _dominance_sums(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, query_x: np.ndarray, query_y: np.ndarray
) -> np.ndarray:
    """For each query i, the sum of `w` over the events with `x < query_x[i]` and
    `y > query_y[i]` (all non-negative ints), offline: the events sorted by x, a query's
    events with smaller x are a prefix, cut into dyadic blocks (one per set bit of the
    prefix's length); at each level the blocks are sorted by y with cumulated weights, and
    one search per query finds its part of one block."""
    n, sums = len(x), np.zeros(len(query_x), np.int64)
    if n == 0 or len(query_x) == 0:
        return sums
    by_x = _argsort_ints(x, int(x.max()).bit_length())
    x, y, w = x[by_x], y[by_x], w[by_x]
    prefix = np.searchsorted(x, query_x, "left")  # the query's events: [0, prefix)
    y_bits = int(max(int(y.max()), int(query_y.max())) + 1).bit_length()
    positions = np.arange(n, dtype=np.int64)
    for level in range(n.bit_length()):
        has = np.flatnonzero((prefix >> level) & 1)
        if len(has) == 0:
            continue
        # blocks of 2^level events, each sorted by y: [block << y_bits | y] is one sorted key
        keyed = ((positions >> level) << y_bits) | y
        order = _argsort_ints(keyed, (n >> level).bit_length() + y_bits)
        keyed = keyed[order]
        cumulated = np.concatenate(([0], np.cumsum(w[order])))
        block = (prefix[has] >> level) - 1  # [block << level, (block + 1) << level)
        low = np.searchsorted(keyed, (block << y_bits) | (query_y[has] + 1), "left")
        high = np.minimum((block + 1) << level, n)
        sums[has] += cumulated[high] - cumulated[low]
    return sums


# --- sampled replays: curves for policies without the stack property ---------------------


class PolicyPoint(NamedTuple):
    """One point of a sampled-replay curve: the estimate, and what it is made of."""

    size: int  # attention blocks of the full-size cache
    num_blocks: int  # attention blocks the sampled replay ran with
    num_mamba_blocks: int  # Mamba state slots the sampled replay ran with
    hit_rate: float  # the estimate: replayed + (lru - sampled_lru), within [0, 1]
    replayed_hit_rate: float  # the sampled replay's hit tokens / its prompt tokens
    lru_hit_rate: float  # the exact LRU curve of the whole recording at `size`
    sampled_lru_hit_rate: float  # the LRU curve of the sample at `num_blocks`


SampleBy = Literal["traffic", "hash"]


def sample_recording(recording: Recording, rate: float, by: SampleBy = "traffic") -> Recording:
    """A `rate` sample of the recording's prefix families: the requests (and pins) whose
    first unit is a kept root, so a family that shares a prefix is kept or dropped whole.

    `by="hash"` keeps a root when its mixed hash falls under `rate` (spatial sampling, as
    SHARDS does it). `by="traffic"` ranks the roots by the tokens their requests carry and
    keeps one in every `1 / rate` down the ranking (systematic sampling): the sample then
    holds about `rate` of the traffic and families of every size, where a hash may keep or
    drop the few popular families that carry most of it. A request with no complete unit
    is its own root. Pure."""
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
    roots = [_root(r) for r in recording.requests]
    if by == "hash":
        threshold = round(rate * (1 << _SAMPLE_BITS))
        salt = int(_SAMPLE_SALT)
        mixed = {root: ((root ^ salt) * int(_GOLDEN)) & _MASK64 for root in roots}
        kept = {root for root, m in mixed.items() if m >> (64 - _SAMPLE_BITS) < threshold}
    else:
        traffic: Counter[int] = Counter()
        for root, request in zip(roots, recording.requests, strict=True):
            traffic[root] += request.num_prompt_tokens + request.num_output_tokens
        ranked = sorted(traffic, key=lambda root: (-traffic[root], root))
        # the k-th root is kept when [k * rate, (k + 1) * rate) + 1/2 crosses an integer:
        # one root from the middle of every run of 1 / rate
        kept = {
            root
            for k, root in enumerate(ranked)
            if math.floor((k + 1) * rate + 0.5) > math.floor(k * rate + 0.5)
        }
    requests = [r for r, root in zip(recording.requests, roots, strict=True) if root in kept]
    concurrency = recording.concurrency  # None: requests keep their arrival steps
    if concurrency is not None:  # the window shrinks with the traffic
        concurrency = max(1, round(concurrency * rate))
    return Recording(recording.geometry, recording.unit, requests, concurrency)


def _root(request: RecordedRequest) -> int:
    if request.units:
        return request.units[0] & _MASK64
    digest = hashlib.blake2b(request.id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def policy_curve(
    recording: Recording,
    cache_config: CacheConfig,
    scheduler_config: SchedulerConfig,
    sizes: Sequence[int],
    rate: float,
    by: SampleBy = "traffic",
    progress: Callable[[PolicyPoint], None] | None = None,
) -> list[PolicyPoint]:
    """The hit rate of `cache_config`'s rules and policy at each size (attention blocks; the
    Mamba slots keep the config's ratio to them): each point one real replay of a `rate`
    sample of the prefix families (`sample_recording`), with the memory scaled by the share
    of the traffic the sample kept (about `rate`). A scaled memory is never below what the
    longest sampled request needs (`engine.scheduling.capacity.blocks_needed`), as an engine admits
    nothing larger. `rate` 1 replays the whole recording at the sizes themselves.

    The replay's hit rate is then corrected by a control variate: the exact LRU curve of the
    whole recording less the LRU curve of the sample at the replay's memory (each one pass).
    Which families the sample kept moves both alike; what is left is the sampling error of
    the difference between the policy and LRU. `progress`, when given, is called with each
    point as it is done."""
    from whatif.run import replay_setting  # the replay loads the whole engine

    sample = sample_recording(recording, rate, by) if rate < 1 else recording
    requests = [r for r in sample.requests if not r.pin]
    if not requests:
        raise ValueError(f"a {rate} sample of {recording.num_requests} requests is empty")
    prompt_tokens = sum(r.num_prompt_tokens for r in requests)
    longest = max(r.num_prompt_tokens + max(1, r.num_output_tokens) for r in requests)
    num_pins = sum(1 for r in sample.requests if r.pin)
    # the memory follows the share of the traffic the sample kept (the ratio estimator's
    # rate): a family is kept whole, so a sample that caught a popular one is heavier
    share = _num_tokens(requests) / _num_tokens(recording.requests)
    states_per_block = cache_config.mamba_num_blocks / cache_config.num_blocks
    # the control variate: a sample heavy in popular families hits more under any policy
    block_size = cache_config.attention_block_size
    exact = lru_curve(block_stream(recording, block_size), sizes).hit_rates
    sampled_blocks = block_stream(sample, block_size)
    points = []
    for size, lru in zip(sizes, exact.tolist(), strict=True):
        config = _scaled(cache_config, size * share, states_per_block, longest, num_pins)
        replayed = sum(replay_setting(sample, config, scheduler_config).hits) / prompt_tokens
        sampled_lru = float(lru_curve(sampled_blocks, [config.num_blocks]).hit_rates[0])
        estimate = min(max(replayed + (lru - sampled_lru), 0.0), 1.0)
        point = PolicyPoint(
            int(size), config.num_blocks, config.mamba_num_blocks, estimate, replayed, lru,
            sampled_lru,
        )  # fmt: skip
        points.append(point)
        if progress is not None:
            progress(point)
    return points


def _scaled(
    config: CacheConfig, blocks: float, states_per_block: float, longest: int, num_pins: int
) -> CacheConfig:
    """`config` with `blocks` attention blocks and the states that go with them, raised to
    what a request of `longest` tokens needs (the engine admits nothing larger)."""
    config = dataclasses.replace(
        config,
        num_blocks=max(round(blocks), 1),
        num_mamba_blocks=max(round(blocks * states_per_block), 1),
    )
    needs = blocks_needed(longest, config, num_pins)
    return dataclasses.replace(
        config,
        num_blocks=max(config.num_blocks, needs[ATTENTION]),
        num_mamba_blocks=max(config.mamba_num_blocks, needs[MAMBA]),
    )


def _num_tokens(requests: Sequence[RecordedRequest]) -> int:
    return sum(r.num_prompt_tokens + r.num_output_tokens for r in requests if not r.pin)
