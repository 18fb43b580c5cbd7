"""Units for the tier tests: chains of small units whose tensors are made from a seed, so a
test can build the same unit twice and compare what a tier gives back with what it was given."""

from __future__ import annotations

import pytest
import torch

from engine.hashing import hash_prefix
from engine.tiers import TierUnit

UNIT_TOKENS = 4  # tokens per unit in these tests


def make_unit(
    token_ids: list[int],
    index: int,
    num_blocks: int = 1,
    width: int = 4,
    salt: str | None = None,
) -> TierUnit:
    """The `index`th unit of a chain over `token_ids` (`UNIT_TOKENS` tokens a unit): K/V of
    `num_blocks` blocks and a conv/SSM state, filled from the unit's key so that two units of
    different chains differ. Its bytes: `num_blocks * 2 * width * 4 + 2 * width * 4`."""
    keys = hash_prefix(token_ids[: (index + 1) * UNIT_TOKENS], UNIT_TOKENS, salt)
    seed = int.from_bytes(keys[index][:4], "little")
    generator = torch.Generator().manual_seed(seed)

    def tensor(dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(width, generator=generator).to(dtype)

    blocks = tuple({"k.0": tensor(), "v.0": tensor()} for _ in range(num_blocks))
    state = {"conv.0": tensor(), "ssm.0": tensor()}
    parent = keys[index - 1] if index else None
    return TierUnit(
        keys[index], parent, index * UNIT_TOKENS, (index + 1) * UNIT_TOKENS, blocks, state
    )


def make_chain(seed: int, num_units: int, **kwargs) -> list[TierUnit]:
    """`num_units` units chained root first over tokens drawn from `seed`."""
    token_ids = [(seed * 7919 + i * 31) % 50_000 for i in range(num_units * UNIT_TOKENS)]
    return [make_unit(token_ids, i, **kwargs) for i in range(num_units)]


UNIT_BYTES = make_chain(0, 1)[0].size_bytes  # one block, width 4: 64 bytes


@pytest.fixture
def fingerprint() -> dict:
    return {"model": "tiny-bamba", "dtype": "float32", "attention_block_size": 16, "unit": 4}
