"""Both backends of the shared tier over real storage: Redis at 127.0.0.1:6379 (DB 7, a key
prefix unique to each test) and a temp directory."""

from __future__ import annotations

import os
import uuid

import pytest
import redis

from sharedstore import SharedConfig, open_store

REDIS_URL = os.environ.get("JUNCTION_TEST_SHARED_REDIS", "redis://127.0.0.1:6379/7")


@pytest.fixture
def prefix():
    """A key prefix of this test's own; its keys are deleted after it."""
    name = f"junction-test:{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=["redis", "directory"])
def make_store(request, prefix, tmp_path):
    """`make_store(capacity_bytes, ttl_s=3600, namespace="ns")`: a backend; each call of one
    test opens the same store again (another engine's connection)."""

    def make(capacity_bytes: int, ttl_s: int = 3600, namespace: str = "ns"):
        if request.param == "redis":
            config = SharedConfig(REDIS_URL, capacity_bytes, ttl_s, prefix=prefix)
        else:
            config = SharedConfig(str(tmp_path / "shared"), capacity_bytes, ttl_s)
        return open_store(config, namespace)

    make.kind = request.param
    return make
