"""Engines sharing units through the shared tier, on the ledger runner (a block read wrong
raises `LedgerMismatch`): engine B, fresh, of the same geometry, hits the system prompts
engine A computed, loads them from the shared store, counts them as loaded from shared, and
answers as a cache-off engine does; a salted request never reads another salt's entries; an
engine of another geometry never reads them; a dead store costs hits, never a request."""

from __future__ import annotations

import logging
import random
import socket
import subprocess
import time

import pytest
import redis

from engine.config import CacheConfig, ModelConfig, TierConfig
from engine.engine import Engine
from engine.events import BlockStored, UnitLoaded
from engine.request import SamplingParams
from engine.tiers.shared import SHARED
from sharedstore import SharedConfig, open_store
from tests.sharedstore.conftest import REDIS_URL

CACHE = CacheConfig(block_size=16, mamba_block_size=64, num_blocks=96, num_mamba_blocks=16)
VOCAB = 256


def systems(seed: int = 0, count: int = 3, length: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(count)]


def with_tails(prefixes: list[list[int]], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [p + [rng.randrange(VOCAB) for _ in range(rng.randint(3, 20))] for p in prefixes]


def run(engine: Engine, token_lists, salt: str | None = None, max_tokens: int = 3) -> list:
    requests = []
    for token_ids in token_lists:
        request = engine.add_request(
            token_ids, SamplingParams(max_tokens=max_tokens), cache_salt=salt
        )
        while engine.has_unfinished():
            engine.step()
            engine.check_invariants()
        requests.append(request)
    return requests


def cache_off(token_lists) -> list:
    off = CacheConfig(**{**CACHE.__dict__, "enable_prefix_caching": False})
    return [r.output_token_ids for r in run(Engine(off, runner="ledger"), token_lists)]


@pytest.fixture(params=["redis", "directory"])
def shared(request, prefix, tmp_path):
    """An opener of the store, as `Engine(shared=...)` takes it."""
    if request.param == "redis":
        config = SharedConfig(REDIS_URL, 1 << 26, 3600, prefix=prefix)
    else:
        config = SharedConfig(str(tmp_path / "shared"), 1 << 26, 3600)
    return lambda namespace: open_store(config, namespace)


def engine(shared, host_bytes: int = 0, **kwargs) -> Engine:
    return Engine(
        CACHE,
        runner="ledger",
        tiers=TierConfig(host_cache_bytes=host_bytes),
        shared=shared,
        **kwargs,
    )


@pytest.mark.parametrize("host_bytes", [0, 1 << 22])
def test_engine_b_loads_what_engine_a_computed(shared, host_bytes):
    a, b = engine(shared, host_bytes), engine(shared, host_bytes)
    run(a, with_tails(systems(), seed=1))
    published = a.tier_stats()
    assert published.num_published > 0 and published.shared.tier.bytes_in > 0
    assert any(isinstance(e, BlockStored) and e.medium == SHARED for e in a.sink.events)

    again = with_tails(systems(), seed=2)
    requests = run(b, again)
    stats = b.tier_stats()
    assert stats.num_shared_loads == len(again)  # every system prompt, from shared
    assert stats.num_shared_loaded_tokens >= len(again) * 192
    assert stats.shared.tier.num_hits > 0
    assert all(r.num_cached_tokens >= 192 for r in requests)
    loads = [e for e in b.sink.events if isinstance(e, UnitLoaded)]
    assert loads and all(SHARED in e.media for e in loads)
    assert [r.output_token_ids for r in requests] == cache_off(again)

    # asked again on B: from its own device now, not the store
    before = b.tier_stats().num_shared_loads
    run(b, with_tails(systems()[:1], seed=3))
    assert b.tier_stats().num_shared_loads == before


def test_a_salted_request_never_reads_another_salts_entries(shared):
    a, b = engine(shared), engine(shared)
    run(a, with_tails(systems(), seed=1), salt="tenant-a")
    again = with_tails(systems(), seed=2)
    other = run(b, again, salt="tenant-b")
    assert b.tier_stats().num_loads == 0
    assert all(r.num_cached_tokens == 0 for r in other)
    unsalted = run(engine(shared), again)
    assert all(r.num_cached_tokens == 0 for r in unsalted)
    same = run(engine(shared), again, salt="tenant-a")
    assert all(r.num_cached_tokens >= 192 for r in same)
    assert [r.output_token_ids for r in same] == cache_off(again)


def test_an_engine_of_another_geometry_never_reads_them(shared):
    run(engine(shared), with_tails(systems(), seed=1))
    other = Engine(
        CACHE,
        runner="ledger",
        model_config=ModelConfig(name="another-model"),
        tiers=TierConfig(),
        shared=shared,
    )
    requests = run(other, with_tails(systems(), seed=2))
    assert other.tier_stats().num_loads == 0
    assert all(r.num_cached_tokens == 0 for r in requests)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(port: int) -> None:
    client = redis.Redis(port=port, socket_timeout=0.5)
    for _ in range(100):
        try:
            client.ping()
            return
        except redis.RedisError:
            time.sleep(0.05)
    raise AssertionError(f"redis-server on port {port} did not start")


def test_a_dead_store_costs_hits_never_a_request_and_says_so_once(prefix, caplog):
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        config = SharedConfig(f"redis://127.0.0.1:{port}/0", 1 << 26, 3600, prefix=prefix)
        opener = lambda namespace: open_store(config, namespace)  # noqa: E731
        wait_until_up(port)
        a, b = engine(opener), engine(opener)
        run(a, with_tails(systems(), seed=1))
        assert a.tier_stats().shared.is_up and a.tier_stats().num_published > 0
        server.kill()
        server.wait()
        caplog.set_level(logging.WARNING, logger="junction.shared")
        again = with_tails(systems(), seed=2)
        requests = run(b, again) + run(b, with_tails(systems(seed=9), seed=3))
        stats = b.tier_stats()
        assert stats.num_loads == 0 and not stats.shared.is_up and stats.shared.num_errors > 0
        assert [r.output_token_ids for r in requests[: len(again)]] == cache_off(again)
        down = [r for r in caplog.records if "is down" in r.getMessage()]
        assert len(down) == 1
    finally:
        server.kill()
        server.wait()


def test_a_request_of_one_step_still_publishes_its_states(shared):
    """A prompt whose only step is its prefill: the copy out happens in a step of its own."""
    a = engine(shared)
    prompt = with_tails(systems(), seed=1)[0]
    run(a, [prompt], max_tokens=1)
    assert not a.has_unfinished()
    assert a.tier_stats().num_published > 0
    b = engine(shared)
    (request,) = run(b, [prompt[:256] + [1, 2, 3]], max_tokens=1)
    assert request.num_cached_tokens >= 192
    assert b.tier_stats().num_shared_loads == 1
