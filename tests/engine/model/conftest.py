"""Fixtures of the model tests: the seeded default model and a paged KV layout over it."""

from __future__ import annotations

import pytest
import torch

from engine.config import ModelConfig
from engine.model.build import build_model
from engine.model.hybrid import HybridModel

BLOCK_SIZE = 16


@pytest.fixture(scope="package")
def config() -> ModelConfig:
    return ModelConfig(device="cpu")


@pytest.fixture(scope="package")
def model(config: ModelConfig) -> HybridModel:
    return build_model(config)


def random_tokens(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed))


class PagedKV:
    """KV caches of every attention layer and the slots of requests laid out in blocks."""

    def __init__(self, model: HybridModel, num_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        self.block_size = block_size
        shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
        self.caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in model.attention_layer_ids]

    def slots(self, block_ids: list[int], begin: int, end: int) -> torch.Tensor:
        """Flat slots of positions begin .. end - 1 of a request whose table is `block_ids`."""
        positions = torch.arange(begin, end)
        table = torch.tensor(block_ids)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def clone(self) -> PagedKV:
        copy = object.__new__(PagedKV)
        copy.block_size = self.block_size
        copy.caches = [(k.clone(), v.clone()) for k, v in self.caches]
        return copy


def prefill_chunks(model, kv: PagedKV, block_ids, token_ids, bounds, save_offsets=()):
    """Prefill `token_ids` in chunks ending at each of `bounds`; returns the last output."""
    states, begin, out = None, 0, None
    for end in bounds:
        out = model.prefill(
            token_ids[begin:end],
            begin,
            kv.caches,
            kv.slots(block_ids, begin, end),
            kv.slots(block_ids, 0, end),
            states,
            list(save_offsets),
        )
        states, begin = out.final_states, end
    return out


def batch_states(states_per_request):
    """Per request a list of per-layer (conv, ssm) -> per layer (conv [b, ...], ssm [b, ...])."""
    return [
        (
            torch.stack([s[i][0] for s in states_per_request]),
            torch.stack([s[i][1] for s in states_per_request]),
        )
        for i in range(len(states_per_request[0]))
    ]
