"""Root-mean-square norms: the plain one before every block, and Mamba-2's gated one.

Glossary: `d` the normalised width. Both norms compute in float32 and cast back, so a
bfloat16 model normalises with the same precision as a float32 one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_normalize(x: Tensor, eps: float) -> Tensor:
    """`x / rms(x)` over the last axis, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """`(offset + weight) * x / rms(x)`; the pre-norm of every block and the final norm.

    `offset` is 0 for most checkpoints; Qwen3.5 and Qwen3-Next store the weight centred on zero
    and scale by `1 + weight`.
    """

    def __init__(self, d: int, eps: float = 1e-5, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:  # [..., d] -> [..., d]
        scale = self.weight.float() + self.offset if self.offset else self.weight.float()
        return (rms_normalize(x, self.eps) * scale).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm: gate first, then normalise, `weight * norm(y * silu(z))`.

    With one group the norm runs over the whole inner width; with `groups` of them, over each
    contiguous `d / groups` slice on its own (Nemotron-H normalises per B/C group).
    """

    def __init__(self, d: int, eps: float = 1e-5, groups: int = 1) -> None:
        super().__init__()
        if d % groups:
            raise ValueError(f"gated norm width {d} does not split into {groups} groups")
        self.eps = eps
        self.groups = groups
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, y: Tensor, z: Tensor) -> Tensor:  # [..., d], [..., d] -> [..., d]
        gated = y.float() * F.silu(z.float())
        grouped = gated.unflatten(-1, (self.groups, -1))  # [..., groups, d / groups]
        normed = rms_normalize(grouped, self.eps).flatten(-2)  # [..., d]
        return (normed * self.weight.float()).to(y.dtype)
