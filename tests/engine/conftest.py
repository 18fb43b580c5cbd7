"""Factories shared by the engine tests."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from engine.cache.coordinator import HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.config import CacheConfig, ModelConfig
from engine.events import ListSink
from engine.hashing import hash_prefix

#: A hybrid model small enough for many CPU runs: 4 layers, one of them attention.
TINY_MODEL = ModelConfig(
    num_layers=4,
    num_attention_layers=1,
    d_model=64,
    num_heads=4,
    num_kv_heads=2,
    extra={"d_state": 16},
)


def tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]


class CacheBuilder:
    """Registers entries straight into a coordinator's pools, as finished requests would."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.sink = ListSink()
        self.coordinator = HybridCoordinator(config, self.sink)
        self.unit = config.match_unit

    def attention(self, token_ids: list[int], positions: list[int]) -> list[int]:
        """Cache attention keys at `positions` (one block per block span); returns block ids."""
        hashes = hash_prefix(token_ids, self.unit)
        pool = self.coordinator.attention.pool
        size = pool.block_size
        by_block: dict[int, list] = {}
        for position in positions:
            by_block.setdefault((position - 1) // size, []).append(
                (hashes[position // self.unit - 1], position, CheckpointReason.BLOCK)
            )
        block_ids = []
        for _index, keys in sorted(by_block.items()):
            (block,) = pool.allocate(1)
            pool.cache(block.block_id, keys, None)
            pool.free([block.block_id])
            block_ids.append(block.block_id)
        return block_ids

    def checkpoint(self, token_ids: list[int], position: int) -> int:
        hashes = hash_prefix(token_ids, self.unit)
        pool = self.coordinator.mamba.pool
        (block,) = pool.allocate(1)
        pool.cache(
            block.block_id,
            [(hashes[position // self.unit - 1], position, CheckpointReason.RESEND)],
            None,
        )
        pool.free([block.block_id])
        return block.block_id

    def lookup(self, token_ids: list[int]):
        return self.coordinator.lookup(hash_prefix(token_ids, self.unit), len(token_ids), True)


@pytest.fixture
def cache_builder():
    return CacheBuilder


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Small Hugging Face checkpoints, one per variant, built once for the session."""
    from tests.engine.model.hf_checkpoints import CheckpointCache

    return CheckpointCache(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module of checkpoint tests (two fight on a shared machine)."""
    from tests.engine.model.hf_checkpoints import one_torch_thread

    with one_torch_thread():
        yield
