"""Rotary position embedding applied at explicit integer positions.

Glossary: `l` tokens, `h` heads, `dh` head dim (even), `f = dh / 2` frequencies.

A chunk prefilled from `start` and a decode step at `position` must rotate a key exactly as
the whole-sequence reference does, so the angles depend only on the absolute position. They are
formed in float64: at positions near 10^4 a float32 product `position * frequency` already
loses about 1e-3 of a radian.
"""

from __future__ import annotations

import torch
from torch import Tensor


class RotaryEmbedding:
    """Rotate-half RoPE: pairs `(x[i], x[i + f])` turn by `position * theta^(-2i / dh)`."""

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim  # [f]
        self.inv_freq = theta**-exponents  # [f]

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """`positions` [l] long -> (cos, sin), each [l, f] float64 on the positions' device."""
        inv_freq = self.inv_freq.to(positions.device)
        angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [l, f]
        return angles.cos(), angles.sin()

    def apply(self, x: Tensor, positions: Tensor) -> Tensor:
        """`x` [l, h, dh] at `positions` [l] -> rotated [l, h, dh], same dtype."""
        cos, sin = self.cos_sin(positions)
        cos = cos[:, None, :].to(torch.float32)  # [l, 1, f]
        sin = sin[:, None, :].to(torch.float32)  # [l, 1, f]
        x1, x2 = x.float().chunk(2, dim=-1)  # [l, h, f] each
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # [l, h, dh]
        return rotated.to(x.dtype)
