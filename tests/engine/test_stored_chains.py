"""Each `BlockStored` event names the prefix it stores: after prefills of requests that share
prefixes (partial hits, blocks finished by later chunks), every stored attention key is the
unit hash of a prefix ending inside the block's `token_range`, in order, and its
`parent_block_hash` is the hash of that same prefix at the block's start (None for a block
at 0). A consumer (the store's attribution, a bridged table) rebuilds chains from exactly
these two fields."""

from __future__ import annotations

import numpy as np

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import BlockStored, ListSink
from engine.hashing import hash_prefix
from engine.traces.replay import replay
from engine.traces.trace import TraceRequest

UNIT, BLOCK, MAMBA = 16, 64, 128


def requests() -> list[TraceRequest]:
    rng = np.random.default_rng(7)
    shared = rng.integers(1, 50_000, 300).tolist()  # ends inside a block
    items = []
    for index in range(12):
        own = rng.integers(1, 50_000, int(rng.integers(20, 200))).tolist()
        cut = int(rng.integers(150, 300))  # some share less of the system prompt
        prompt = shared[:cut] + own
        items.append(TraceRequest(index + 1, f"r{index}", prompt, 4, None, 0.0, 1.0, None))
    return items


def test_every_stored_key_and_parent_is_the_prefix_hash_at_its_place() -> None:
    trace = requests()
    index: dict[str, int] = {}  # hex hash -> the position its prefix ends at
    for request in trace:
        for k, key in enumerate(hash_prefix(request.token_ids, UNIT)):
            index[key.hex()] = (k + 1) * UNIT
    cache = CacheConfig(
        block_size=BLOCK, mamba_block_size=MAMBA, prefix_match_unit=UNIT, num_blocks=400
    )
    sink = ListSink()
    engine = Engine(cache, SchedulerConfig(max_num_batched_tokens=96), runner="null", sink=sink)
    replay(engine, trace, concurrency=3)
    checked = 0
    for event in sink.drain():
        if not isinstance(event, BlockStored) or event.group != "attention":
            continue
        if not all(key in index for key in event.block_hashes):
            continue  # a block of output tokens: the trace does not know them
        start, end = event.token_range
        positions = [index[key] for key in event.block_hashes]
        assert positions == sorted(positions), event
        assert all(start < p <= end for p in positions), event
        assert start % BLOCK == 0 and end - start <= BLOCK, event
        if start == 0:
            assert event.parent_block_hash is None, event
        else:
            assert index.get(event.parent_block_hash) == start, event
            parent_chain = [r for r in trace if hash_at(r, start) == event.parent_block_hash]
            assert any(hash_at(r, positions[0]) == event.block_hashes[0] for r in parent_chain)
        checked += 1
    assert checked >= 30  # prefills of 12 requests stored that many blocks at least


def hash_at(request: TraceRequest, position: int) -> str | None:
    hashes = hash_prefix(request.token_ids, UNIT)
    return hashes[position // UNIT - 1].hex() if position // UNIT <= len(hashes) else None
