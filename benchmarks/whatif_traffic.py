"""Recorded traffic for `benchmarks/whatif.py`: synthetic chains of a realistic mix, made
directly (no token ids are drawn or hashed: 100k requests of a few thousand tokens would take
minutes of blake2b).

The mix: `num_families` system prompts (lengths log-normal around `system_len`, popularity
Zipf-like, so a few families carry most traffic), and conversations that each pick a family
and run a geometric number of turns. Turn `t`'s prompt is the system prompt, every earlier
user message and answer, and a new user message; its output is the answer. Conversations
start at random times and their turns come after think times, so turns of many conversations
interleave and a next turn finds its history at every reuse distance.

A request's tokens are a list of segments, each a run of tokens no other segment shares. The
chain hash at position `p` names the prefix `[0, p)`: the segments before the one `p` falls
in (a node id chained over their ids), that segment's id and the offset in it. Equal hashes
mean equal prefixes, as a recording's chains do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.geometry import CacheGeometry
from whatif.recording import RecordedRequest, Recording

_NODE = np.uint64(0x9E37_79B9_7F4A_7C15)
_SEGMENT = np.uint64(0xC2B2_AE3D_27D4_EB4F)


def _log_normal(rng: np.random.Generator, median: float, size: int, low: int, high: int):
    values = rng.lognormal(np.log(median), 0.6, size)
    return np.clip(values.round(), low, high).astype(np.int64)


def _mix(values: np.ndarray) -> np.ndarray:
    z = values ^ (values >> np.uint64(31))
    z = z * np.uint64(0xBF58_476D_1CE4_E5B9)
    return z ^ (z >> np.uint64(29))


def _chain(segment_ids: list[int], lengths: list[int], unit: int) -> list[int]:
    """The chain hash at every complete unit of the segments' concatenation."""
    ends = np.cumsum(lengths)
    positions = np.arange(unit, int(ends[-1]) + 1, unit)
    inside = np.searchsorted(ends, positions, "left")  # the segment each position ends in
    nodes = np.zeros(len(segment_ids), np.uint64)  # the node before each segment
    node = 0
    for index, segment in enumerate(segment_ids[:-1]):
        node = hash((node, segment)) & ((1 << 64) - 1)
        nodes[index + 1] = node
    starts = ends - np.asarray(lengths)
    offsets = (positions - starts[inside]).astype(np.uint64)
    segments = np.asarray(segment_ids, np.uint64)[inside]
    return _mix(nodes[inside] * _NODE ^ segments * _SEGMENT ^ offsets).tolist()


def conversations(
    num_requests: int,
    *,
    seed: int = 0,
    unit: int = 16,
    num_families: int = 300,
    system_len: int = 1000,
    user_len: int = 120,
    answer_len: int = 150,
    mean_turns: float = 3.0,
    block_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> Recording:
    """A recording of `num_requests` requests of the mix above, in arrival order; `progress`
    is called with the number of requests made every thousand."""
    rng = np.random.default_rng([seed, 0x77686174])
    systems = _log_normal(rng, system_len, num_families, 64, 8 * system_len)
    popularity = 1.0 / np.arange(1, num_families + 1) ** 1.1
    turns = []  # (arrival time, conversation, turn)
    num_conversations = int(num_requests / mean_turns * 1.3) + 1
    lengths = rng.geometric(1.0 / mean_turns, num_conversations)
    begins = rng.uniform(0, num_conversations, num_conversations)
    for conversation, (length, begin) in enumerate(
        zip(lengths.tolist(), begins.tolist(), strict=True)
    ):
        gaps = rng.exponential(40.0, length)
        turns.extend((begin + t, conversation, index) for index, t in enumerate(np.cumsum(gaps)))
    turns.sort()
    turns = turns[:num_requests]
    family_of = rng.choice(num_families, num_conversations, p=popularity / popularity.sum())
    requests = []
    next_segment = num_families
    history: dict[int, tuple[list[int], list[int]]] = {}  # conversation: its segments so far
    for arrival, (_, conversation, _turn) in enumerate(turns):
        family = int(family_of[conversation])
        ids, lens = history.get(conversation, ([family], [int(systems[family])]))
        user, answer = _log_normal(rng, user_len, 2, 4, 16 * user_len)[0], 0
        answer = int(_log_normal(rng, answer_len, 1, 4, 16 * answer_len)[0])
        ids = [*ids, next_segment]
        lens = [*lens, int(user)]
        prompt = sum(lens)
        units = _chain([*ids, next_segment + 1], [*lens, answer], unit)
        history[conversation] = ([*ids, next_segment + 1], [*lens, answer])
        next_segment += 2
        requests.append(
            RecordedRequest(
                f"c{conversation}-{arrival}",
                units,
                num_prompt_tokens=prompt,
                num_output_tokens=answer,
                arrival_index=arrival,
            )
        )
        if progress is not None and (arrival + 1) % 1000 == 0:
            progress(1000)
    geometry = CacheGeometry(block_size=block_size, prefix_match_unit=unit)
    return Recording(geometry, unit, requests)
