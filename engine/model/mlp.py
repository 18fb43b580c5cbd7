"""The feed-forward block: gated (SwiGLU-style) or plain, with the activation the model names.

Glossary: `d` model width, `f` inner width, `t` tokens (any leading shape).

Gated:  y = down(act(gate) * up),  [gate; up] = up_proj(x)  (one [2f, d] matrix, gate first)
Plain:  y = down(act(up_proj(x)))
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn


def relu_squared(x: Tensor) -> Tensor:
    return F.relu(x).square()


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
    "relu2": relu_squared,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}: choose one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class MLP(nn.Module):
    def __init__(
        self, d: int, inner: int, act: str = "silu", gated: bool = True, bias: bool = False
    ) -> None:
        super().__init__()
        self.gated = gated
        self.act = activation(act)
        self.up_proj = nn.Linear(d, (2 if gated else 1) * inner, bias=bias)  # [(2)f, d]
        self.down_proj = nn.Linear(inner, d, bias=bias)  # [d, f]

    def forward(self, x: Tensor) -> Tensor:  # [t, d] -> [t, d]
        up = self.up_proj(x)  # [t, (2)f]
        if self.gated:
            gate, up = up.chunk(2, dim=-1)  # [t, f] each
            return self.down_proj(self.act(gate) * up)
        return self.down_proj(self.act(up))
