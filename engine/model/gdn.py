"""The Gated DeltaNet mixer (Qwen3.5 / Qwen3-Next linear attention): projections, causal conv,
the gated delta rule (`engine.model.delta_rule`), a per-head gated norm.

Glossary (one sequence; a leading `b` where a batch of sequences steps together):
    l   tokens                      d   model width
    Hk  query/key heads             Hv  value heads (a multiple of Hk), h = Hv in the rule
    r   value heads per key head    dk  key head dim          dv  value head dim
    k   conv width                  m   conv channels = 2 * Hk * dk + Hv * dv (q, k and v)
    z   the output gate [l, Hv, dv] S   [Hv, dk, dv] the rule's state

State of one sequence: conv [m, k - 1] (the last k - 1 conv inputs, oldest first) and S. The
mixer takes states in any dtype and hands them back in float32; the rule always runs in float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.delta_rule import chunked_rule, recurrent_step, sequential_rule
from engine.model.mamba2 import MambaPrefill
from engine.model.norm import rms_normalize

GDNState = tuple[Tensor, Tensor]  # (conv [m, k - 1], S [Hv, dk, dv]), or with a leading b

L2_EPS = 1e-6  # of the q/k L2 norm, inside the square root of the sum of squares


class GDNShape(NamedTuple):
    d: int  # model width
    num_k_heads: int  # Hk (query/key heads)
    num_v_heads: int  # Hv (value heads; a multiple of Hk, q/k are repeated to Hv)
    head_k_dim: int  # dk
    head_v_dim: int  # dv
    conv_kernel: int = 4  # k
    chunk_size: int = 64  # c

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # m
        return 2 * self.key_dim + self.value_dim

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv [m, k - 1], recurrent [Hv, dk, dv]) of one sequence."""
        return (
            (self.conv_dim, self.conv_kernel - 1),
            (self.num_v_heads, self.head_k_dim, self.head_v_dim),
        )


# --- the mixer ---------------------------------------------------------------------------------


class HeadGatedRMSNorm(nn.Module):
    """The output norm, per value head: normalise first, then `weight * norm(o) * silu(z)`.

    (Mamba-2's `GatedRMSNorm` gates before it normalises; this one after.) Float32 compute, cast
    to z's dtype once at the end.
    """

    def __init__(self, dv: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dv))

    def forward(self, o: Tensor, z: Tensor) -> Tensor:  # [..., dv], [..., dv] -> [..., dv]
        normed = rms_normalize(o, self.eps) * self.weight.float()
        return (normed * F.silu(z.float())).to(z.dtype)


class GatedDeltaNet(nn.Module):
    """The mixer. `fused` picks Qwen3-Next's projections (`in_proj_qkvz`, `in_proj_ba`, grouped
    per key head) over Qwen3.5's (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`); the conv
    channels are [q, k, v] either way. No biases, no conv bias, no skip term.
    """

    def __init__(self, shape: GDNShape, *, norm_eps: float = 1e-6, fused: bool = False) -> None:
        super().__init__()
        if shape.num_v_heads % shape.num_k_heads:
            raise ValueError(
                f"{shape.num_v_heads} value heads are not a multiple of "
                f"{shape.num_k_heads} key heads"
            )
        if shape.conv_kernel < 1 or shape.chunk_size < 1:
            raise ValueError(
                f"conv_kernel {shape.conv_kernel} and chunk_size {shape.chunk_size} must be >= 1"
            )
        self.shape = shape
        self.fused = fused
        self.m = shape.conv_dim
        self.r = shape.num_v_heads // shape.num_k_heads
        d, hv = shape.d, shape.num_v_heads
        if fused:
            self.in_proj_qkvz = nn.Linear(d, 2 * shape.key_dim + 2 * shape.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(d, 2 * hv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(d, self.m, bias=False)
            self.in_proj_z = nn.Linear(d, shape.value_dim, bias=False)
            self.in_proj_b = nn.Linear(d, hv, bias=False)
            self.in_proj_a = nn.Linear(d, hv, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(self.m, shape.conv_kernel))
        self.dt_bias = nn.Parameter(torch.empty(hv))
        self.A_log = nn.Parameter(torch.empty(hv))
        self.norm = HeadGatedRMSNorm(shape.head_v_dim, norm_eps)
        self.out_proj = nn.Linear(shape.value_dim, d, bias=False)

    def reset_parameters(self, generator: torch.Generator, out_scale: float) -> None:
        """Seeded init. `out_scale` shrinks out_proj so the residual stream grows slowly."""
        s = self.shape
        hv = s.num_v_heads
        with torch.no_grad():
            for proj in self._in_projs():
                proj.weight.normal_(0.0, s.d**-0.5, generator=generator)
            self.conv_weight.uniform_(-1.0, 1.0, generator=generator).mul_(s.conv_kernel**-0.5)
            # dt log-uniform in [1e-3, 1e-1] at zero input; dt_bias is its inverse softplus.
            u = torch.rand(hv, generator=generator)
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.A_log.copy_(torch.log(torch.empty(hv).uniform_(1.0, 16.0, generator=generator)))
            self.norm.weight.fill_(1.0)
            self.out_proj.weight.normal_(0.0, out_scale * s.value_dim**-0.5, generator=generator)

    def zero_state(self, device: torch.device) -> GDNState:
        conv_shape, rec_shape = self.shape.state_shapes()
        return torch.zeros(conv_shape, device=device), torch.zeros(rec_shape, device=device)

    # --- pieces shared by every path -------------------------------------------------------

    def _in_projs(self) -> list[nn.Linear]:
        if self.fused:
            return [self.in_proj_qkvz, self.in_proj_ba]
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def _project(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """u [..., d] -> conv input [..., m] ([q, k, v]), z [..., Hv, dv], b, a [..., Hv]."""
        s = self.shape
        lead = u.shape[:-1]
        if not self.fused:
            z = self.in_proj_z(u).unflatten(-1, (s.num_v_heads, s.head_v_dim))  # [..., Hv, dv]
            return self.in_proj_qkv(u), z, self.in_proj_b(u), self.in_proj_a(u)
        # Qwen3-Next groups the projection by key head: [q, k, v (r heads), z (r heads)] each.
        dk, rdv = s.head_k_dim, self.r * s.head_v_dim
        grouped = self.in_proj_qkvz(u).unflatten(-1, (s.num_k_heads, -1))  # [..., Hk, 2dk + 2rdv]
        q, k, v, z = torch.split(grouped, [dk, dk, rdv, rdv], dim=-1)  # [..., Hk, dk | rdv]
        qkv = torch.cat((q.flatten(-2), k.flatten(-2), v.flatten(-2)), dim=-1)  # [..., m]
        z = z.reshape(*lead, s.num_v_heads, s.head_v_dim)  # [..., Hv, dv]
        ba = self.in_proj_ba(u).unflatten(-1, (s.num_k_heads, 2 * self.r))  # [..., Hk, 2r]
        b, a = torch.split(ba, [self.r, self.r], dim=-1)  # [..., Hk, r]
        return qkv, z, b.flatten(-2), a.flatten(-2)  # b, a [..., Hv]

    def _rule_inputs(self, qkv: Tensor, b: Tensor, a: Tensor) -> tuple[Tensor, ...]:
        """Conv output [..., m], b, a [..., Hv] -> q, k [..., Hv, dk], v [..., Hv, dv],
        g, beta [..., Hv], all float32."""
        s = self.shape
        q, k, v = torch.split(qkv.float(), [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = q.unflatten(-1, (s.num_k_heads, s.head_k_dim))  # [..., Hk, dk]
        k = k.unflatten(-1, (s.num_k_heads, s.head_k_dim))  # [..., Hk, dk]
        v = v.unflatten(-1, (s.num_v_heads, s.head_v_dim))  # [..., Hv, dv]
        q = q * torch.rsqrt(q.pow(2).sum(dim=-1, keepdim=True) + L2_EPS) * s.head_k_dim**-0.5
        k = k * torch.rsqrt(k.pow(2).sum(dim=-1, keepdim=True) + L2_EPS)
        q = q.repeat_interleave(self.r, dim=-2)  # [..., Hv, dk]
        k = k.repeat_interleave(self.r, dim=-2)  # [..., Hv, dk]
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.dt_bias.float())
        return q, k, v, g, torch.sigmoid(b.float())  # g, beta [..., Hv]

    def _output(self, o: Tensor, z: Tensor) -> Tensor:
        """Rule output o [..., Hv, dv], gate z [..., Hv, dv] -> [..., d]."""
        return self.out_proj(self.norm(o, z).flatten(-2))  # [..., d]

    def _conv(self, qkv: Tensor, conv_state: Tensor) -> tuple[Tensor, Tensor]:
        """Causal depthwise conv over a chunk: qkv [l, m], state [m, k - 1].

        Returns (SiLU(conv) [l, m], padded inputs [m, k - 1 + l]); the state after token t
        (1-based) is `padded[:, t : t + k - 1]`.
        """
        padded = torch.cat((conv_state.to(qkv.dtype), qkv.t()), dim=1)  # [m, k - 1 + l]
        out = F.conv1d(padded[None], self.conv_weight[:, None, :], groups=self.m)  # [1, m, l]
        return F.silu(out[0].t()), padded  # [l, m]

    # --- the three paths ---------------------------------------------------------------------

    def prefill(self, u: Tensor, state: GDNState, save_offsets: list[int]) -> MambaPrefill:
        """A chunk u [l, d] from `state`; hands back the state after l and after each offset.

        One pass of the chunked rule yields the state at every offset (`chunked_rule`), on its
        chunk grid or not, exactly.
        """
        length = u.shape[0]
        bad = [o for o in save_offsets if not 0 <= o <= length]
        if bad:
            raise ValueError(f"save offsets {bad} are outside the chunk's {length} tokens")
        k1 = self.shape.conv_kernel - 1
        qkv, z, b, a = self._project(u)  # [l, m], [l, Hv, dv], [l, Hv], [l, Hv]
        qkv, padded = self._conv(qkv, state[0])  # [l, m], [m, k - 1 + l]
        q, k, v, g, beta = self._rule_inputs(qkv, b, a)  # [l, Hv, dk] x2, [l, Hv, dv], [l, Hv] x2

        S = state[1].float().clone()  # a copy: the state at offset 0 must not alias the input
        c = self.shape.chunk_size
        o, S, states_at = chunked_rule(q, k, v, g, beta, S, c, save_offsets)  # [l, Hv, dv]
        states_at[length] = S

        def at(offset: int) -> GDNState:
            return padded[:, offset : offset + k1].float().clone(), states_at[offset]

        saved = {o: at(o) for o in save_offsets}
        return MambaPrefill(self._output(o, z), at(length), saved)

    def step(self, u: Tensor, state: GDNState) -> tuple[Tensor, GDNState]:
        """One token per sequence: u [b, d], conv [b, m, k - 1], S [b, Hv, dk, dv]."""
        qkv, z, b, a = self._project(u)  # [b, m], [b, Hv, dv], [b, Hv], [b, Hv]
        window = torch.cat((state[0].to(qkv.dtype), qkv[:, :, None]), dim=2)  # [b, m, k]
        conv = F.silu((window * self.conv_weight).sum(dim=-1))  # [b, m]
        q, k, v, g, beta = self._rule_inputs(conv, b, a)  # [b, Hv, dk] x2, [b, Hv, dv], [b, Hv] x2
        o, S = recurrent_step(state[1].float(), q, k, v, g, beta)  # [b, Hv, dv], [b, Hv, dk, dv]
        return self._output(o, z), (window[:, :, 1:].float(), S)

    def forward_reference(self, u: Tensor) -> Tensor:
        """u [l, d] from the zero state through the token-by-token rule -> [l, d]."""
        conv_state, S = self.zero_state(u.device)
        qkv, z, b, a = self._project(u)
        qkv, _ = self._conv(qkv, conv_state)
        o, _ = sequential_rule(*self._rule_inputs(qkv, b, a), S)
        return self._output(o, z)
