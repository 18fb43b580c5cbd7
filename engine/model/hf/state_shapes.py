"""The state of one state layer (Mamba-2 or Gated DeltaNet), as config.json gives it.

Glossary (per Mamba-2 layer):
    h   SSM heads          p   head dim          n   state size
    g   groups of B/C      k   conv width        m   conv channels = h * p + 2 * g * n
(per Gated DeltaNet layer, Qwen3.5 / Qwen3-Next):
    Hk  key heads          dk  key head dim      Hv  value heads     dv  value head dim
    k   conv width         m   conv channels = 2 * Hk * dk + Hv * dv

One state slot holds, per state layer, conv [m, k - 1] and ssm [h, p, n] (the layout of
`engine.model.mamba2`), or conv [m, k - 1] and the recurrent matrix [Hv, dk, dv]
(`engine.model.gdn`); one attention token holds, per attention layer, a key and a value of
[K, dh] each. The cache keeps either state as its `mamba` group; the spec names the group by
what it holds (`state_kind`: "mamba" or "linear").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class MambaStateShape:
    """The state of one Mamba layer (every Mamba layer of a model has the same one)."""

    num_heads: int  # h
    head_dim: int  # p
    state_size: int  # n
    num_groups: int  # g
    conv_kernel: int  # k

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.inner_size + 2 * self.num_groups * self.state_size

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_channels, self.conv_kernel - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.state_size)


@dataclass(frozen=True)
class GDNStateShape:
    """The state of one Gated DeltaNet layer: conv [m, k - 1] and recurrent [Hv, dk, dv]."""

    num_k_heads: int  # Hk
    num_v_heads: int  # Hv
    head_k_dim: int  # dk
    head_v_dim: int  # dv
    conv_kernel: int  # k

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_channels, self.conv_kernel - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)


STATE_LAYER_KINDS = ("mamba", "linear")


class StateFields(NamedTuple):
    """Where a family's config.json keeps its state layers' shape."""

    kind: str  # what its state layers are: "mamba" (Mamba-2) or "linear" (Gated DeltaNet)
    shape: type  # MambaStateShape or GDNStateShape
    fields: tuple[str, ...]  # the geometry's fields, in order
    divides: tuple[str, str]  # (dividend, divisor): the first must be a multiple of the second
    what: str  # what the division is, for the error
