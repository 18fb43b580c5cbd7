"""Rotary position embedding applied at explicit integer positions.

Glossary: `l` tokens, `h` heads, `dh` head dim, `r` rotated dims (even, <= dh; all of them
unless the model rotates only part of each head), `f = r / 2` frequencies.

A chunk prefilled from `start` and a decode step at `position` must rotate a key exactly as
the whole-sequence reference does, so the angles depend only on the absolute position. They are
formed in float64: at positions near 10^4 a float32 product `position * frequency` already
loses about 1e-3 of a radian.
"""

from __future__ import annotations

import torch
from torch import Tensor


class RotaryEmbedding:
    """Rotate-half RoPE on the first `r` dims: pairs `(x[i], x[i + f])` turn by
    `position * theta^(-2i / r)`; dims `r ..` pass through unturned."""

    def __init__(
        self, head_dim: int, theta: float = 10000.0, rotary_dim: int | None = None
    ) -> None:
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(
                f"RoPE needs an even rotary_dim in (0, head_dim {head_dim}], got {rotary_dim}"
            )
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        # on the CPU even when a model is built on the meta device: these are not weights
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim
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
        xf = x.float()
        x1, x2 = xf[..., : self.rotary_dim].chunk(2, dim=-1)  # [l, h, f] each
        rotated = torch.cat(
            (x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., self.rotary_dim :]), dim=-1
        )  # [l, h, dh]
        return rotated.to(x.dtype)
