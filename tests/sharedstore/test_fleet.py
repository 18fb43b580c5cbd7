"""Issue 49, "What must show" 1 and 5, end to end: three real `junction serve` engines (torch
runner, the built-in tiny model) sharing units through a real Redis, the real `junction route`
in front of them, the `openai` client. A system prompt computed on engine A is hit on engine B
through the shared store (B's `cached_tokens`, its `/metrics`), with the greedy tokens of a
cache-off engine; a salted request never reads another salt's entries. With the store killed,
requests still succeed with the cache-off engine's tokens, the engine says so once in its log,
and `/metrics` and `/health` say the store is down."""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from tests.api.processes import free_port
from tests.polling import wait_for
from tests.router.processes import (
    MODEL,
    TOKEN,
    Process,
    engine_metric,
    start_engine,
    start_router,
)
from tests.sharedstore.test_engines_share import wait_until_up

#: four torch engines starting at once on a loaded 2-core machine take longer than one
START_S = 300
SMALL = ["--num-blocks", "256", "--num-mamba-blocks", "24", "--host-cache-bytes", "32MiB"]


def shared_engine(log_dir: Path, name: str, url: str, prefix: str) -> Process:
    return start_engine(
        log_dir,
        name,
        *SMALL,
        "--shared-cache-url",
        url,
        "--shared-cache-prefix",
        prefix,
        runner="torch",
    )


def complete(engine: Process, prompt: list[int], salt: str | None = None):
    extra = {} if salt is None else {"cache_salt": salt}
    response = engine.client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, extra_body=extra
    )
    return response.choices[0].text, response.usage.prompt_tokens_details.cached_tokens


def prompts(seed: int) -> tuple[list[int], list[list[int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 200) for _ in range(320)]
    return system, [system + [rng.randrange(1, 200) for _ in range(5 + i)] for i in range(6)]


@contextmanager
def running(*processes: Process) -> Iterator[None]:
    try:
        for process in processes:
            process.wait_healthy(START_S)
        yield
    finally:
        for process in processes:
            process.stop()


@pytest.fixture
def prefix():
    name = f"junction-test:{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url("redis://127.0.0.1:6379/7")
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_a_system_prompt_computed_on_a_is_hit_on_b_through_redis(tmp_path, prefix):
    url = "redis://127.0.0.1:6379/7"
    a, b, c = (shared_engine(tmp_path, name, url, prefix) for name in "abc")
    off = start_engine(tmp_path, "off", "--no-prefix-caching", runner="torch")
    with running(a, b, c, off):
        system, asks = prompts(0)
        text, cached = complete(a, asks[0])
        assert cached == 0
        assert text == complete(off, asks[0])[0]
        assert engine_metric(a, "junction_tier_shared_published_total") > 0

        text, cached = complete(b, asks[1])
        assert cached >= 256  # the system prompt, loaded from the shared store
        assert text == complete(off, asks[1])[0]
        assert engine_metric(b, "junction_tier_shared_loads_total") == 1
        assert engine_metric(b, "junction_tier_shared_loaded_tokens_total") >= 256
        assert engine_metric(b, 'junction_tier_unit_hits_total{tier="shared"}') >= 1
        assert engine_metric(b, "junction_shared_store_up") == 1

        # salts: tenant-a's system prompt is never read by tenant-b, nor by no salt
        _, salted = prompts(1)
        assert complete(a, salted[0], salt="tenant-a")[1] == 0
        assert complete(c, salted[1], salt="tenant-b")[1] == 0
        assert complete(c, salted[2])[1] == 0
        assert engine_metric(c, "junction_tier_shared_loads_total") == 0
        text, cached = complete(c, salted[3], salt="tenant-a")
        assert cached >= 256
        assert text == complete(off, salted[3])[0]
        assert engine_metric(c, "junction_tier_shared_loads_total") == 1

        router = start_router(tmp_path, [a, b, c])
        try:
            text, cached = complete(router, asks[2])
            assert cached >= 256
            assert text == complete(off, asks[2])[0]
        finally:
            router.stop()


def test_the_store_killed_costs_hits_never_a_request_and_is_said_once(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until_up(port)
        a, b = (shared_engine(tmp_path, name, url, "junction:shared") for name in "ab")
        off = start_engine(tmp_path, "off", "--no-prefix-caching", runner="torch")
        with running(a, b, off):
            _, asks = prompts(2)
            complete(a, asks[0])
            assert engine_metric(a, "junction_tier_shared_published_total") > 0
            server.kill()
            server.wait()
            hits = []
            for ask in asks[1:4]:  # B would have hit A's system prompt: now it computes it
                text, cached = complete(b, ask)
                hits.append(cached)
                assert text == complete(off, ask)[0]
            assert hits[0] == 0  # then B's own device holds it
            assert engine_metric(b, "junction_shared_store_up") == 0
            assert engine_metric(b, "junction_shared_store_errors_total") >= 1
            assert engine_metric(b, "junction_tier_shared_loads_total") == 0
            health = httpx.get(f"{b.url}/health", timeout=5).json()
            assert health["shared_store"] == {"url": url, "up": False}
            assert b.log.read_text().count(f"{url} is down") == 1
            router = start_router(tmp_path, [a, b])
            try:  # the router hears it from the feed: /fleet says so, and prices no shared hit

                def fleet() -> dict:
                    auth = {"Authorization": f"Bearer {TOKEN}"}
                    return httpx.get(f"{router.url}/fleet", headers=auth, timeout=5).json()

                complete(b, next(iter(prompts(7)[1])))  # a step: a delta with b's rates
                wait_for("the router to say b's store is down", lambda: fleet()["shared_store"], 30)
                view = fleet()
                assert "down" in view["shared_store"]
                assert {e["shared_store"] for e in view["engines"]} >= {"down"}
            finally:
                router.stop()

            server = subprocess.Popen(
                ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            )
            wait_until_up(port)
            fresh = iter(prompts(seed)[1][0] for seed in range(10, 1000))

            def back() -> bool:  # a prompt B has not seen makes it ask the store again
                complete(b, next(fresh))
                return engine_metric(b, "junction_shared_store_up") == 1

            wait_for("engine b to find the store back", back, 60)
            assert b.log.read_text().count(f"{url} is back") == 1
    finally:
        server.kill()
        server.wait()
