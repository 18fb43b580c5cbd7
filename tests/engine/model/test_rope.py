"""RoPE: a rotation (norms kept) whose query-key products depend only on the offset."""

from __future__ import annotations

import torch

from engine.model.rope import RotaryEmbedding


def test_rotation_keeps_norms_and_position_zero_is_identity() -> None:
    rope = RotaryEmbedding(32)
    x = torch.randn(5, 3, 32, generator=torch.Generator().manual_seed(0))
    rotated = rope.apply(x, torch.tensor([0, 1, 7, 100, 12000]))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotated[0], x[0])


def test_scores_depend_on_the_relative_position_only() -> None:
    rope = RotaryEmbedding(32)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 32, generator=g), torch.randn(1, 1, 32, generator=g)

    def score(m: int, n: int) -> torch.Tensor:
        return (rope.apply(q, torch.tensor([m])) * rope.apply(k, torch.tensor([n]))).sum()

    torch.testing.assert_close(score(10, 3), score(9010, 9003), atol=1e-4, rtol=1e-4)
