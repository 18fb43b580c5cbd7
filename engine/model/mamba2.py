"""The Mamba-2 mixer: projections, causal conv, SSD scan, gated norm.

Glossary:
    l   tokens of a chunk           b   sequences stepping together in decode
    d   model width                 e   inner width = h * p (expand * d unless h is given)
    h   SSM heads                   p   head dim (headdim)
    g   groups of B/C (ngroups)     n   state size (d_state)
    k   conv width (d_conv)         m   conv channels = e + 2 * g * n (x, B and C)

State of one sequence: conv [m, k - 1] (the last k - 1 conv inputs, oldest first) and
ssm [h, p, n]. The mixer takes states in any dtype and hands them back in float32; the scan
always runs in float32.

`prefill` (chunked scan, any number of tokens, states at chosen offsets) and `step` (one token
for a batch) are the two real paths; `forward_reference` runs the sequential scan from zero and
is what tests compare both against.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.norm import GatedRMSNorm
from engine.model.ssd import chunked_scan, sequential_scan, ssm_step

MambaState = tuple[Tensor, Tensor]  # (conv [m, k - 1], ssm [h, p, n]), or with a leading b


class MambaShape(NamedTuple):
    d: int
    expand: int = 2
    headdim: int = 64
    d_state: int = 32
    ngroups: int = 1
    d_conv: int = 4
    chunk_size: int = 64
    nheads: int | None = None  # h when given (e = h * p); else h = expand * d / p

    @property
    def e(self) -> int:
        return self.nheads * self.headdim if self.nheads is not None else self.expand * self.d

    @property
    def h(self) -> int:
        return self.nheads if self.nheads is not None else self.e // self.headdim

    @property
    def m(self) -> int:
        return self.e + 2 * self.ngroups * self.d_state

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv [m, k - 1], ssm [h, p, n]) of one sequence."""
        return (self.m, self.d_conv - 1), (self.h, self.headdim, self.d_state)


class MambaPrefill(NamedTuple):
    y: Tensor  # [l, d]
    final_state: MambaState
    saved_states: dict[int, MambaState]


class Mamba2Mixer(nn.Module):
    """The mixer. Checkpoint details: `bias` on in_proj and out_proj, `conv_bias`, the gated
    norm's `norm_eps` and `norm_groups`, and `dt_limit`, the clamp on dt after softplus.

    The clamp runs in every path (transformers clamps only in its chunked scan), so a token
    leaves the same state whether it was prefilled or decoded, and cached states stay exact.
    """

    def __init__(
        self,
        shape: MambaShape,
        *,
        bias: bool = False,
        conv_bias: bool = True,
        norm_eps: float = 1e-5,
        norm_groups: int = 1,
        dt_limit: tuple[float, float] = (0.0, math.inf),
    ) -> None:
        super().__init__()
        if shape.e % shape.headdim:
            raise ValueError(f"inner width {shape.e} is not a multiple of headdim {shape.headdim}")
        if shape.h % shape.ngroups:
            raise ValueError(f"{shape.h} SSM heads do not split into {shape.ngroups} groups")
        self.shape = shape
        self.e, self.h, self.m = shape.e, shape.h, shape.m
        self.dt_limit = dt_limit
        self.in_proj = nn.Linear(
            shape.d, 2 * self.e + 2 * shape.ngroups * shape.d_state + self.h, bias=bias
        )  # u -> [z, x, B, C, dt]
        self.conv_weight = nn.Parameter(torch.empty(self.m, shape.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(self.m)) if conv_bias else None
        self.dt_bias = nn.Parameter(torch.empty(self.h))
        self.A_log = nn.Parameter(torch.empty(self.h))
        self.D = nn.Parameter(torch.ones(self.h))
        self.norm = GatedRMSNorm(self.e, norm_eps, norm_groups)
        self.out_proj = nn.Linear(self.e, shape.d, bias=bias)

    def reset_parameters(self, generator: torch.Generator, out_scale: float) -> None:
        """Seeded init. `out_scale` shrinks out_proj so the residual stream grows slowly."""
        s = self.shape
        with torch.no_grad():
            self.in_proj.weight.normal_(0.0, s.d**-0.5, generator=generator)
            self.conv_weight.uniform_(-1.0, 1.0, generator=generator).mul_(s.d_conv**-0.5)
            if self.conv_bias is not None:
                self.conv_bias.zero_()
            # dt log-uniform in [1e-3, 1e-1] at zero input; dt_bias is its inverse softplus.
            u = torch.rand(self.h, generator=generator)
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.A_log.copy_(
                torch.log(torch.empty(self.h).uniform_(1.0, 16.0, generator=generator))
            )
            self.D.fill_(1.0)
            self.norm.weight.fill_(1.0)
            self.out_proj.weight.normal_(0.0, out_scale * self.e**-0.5, generator=generator)

    def zero_state(self, device: torch.device) -> MambaState:
        conv_shape, ssm_shape = self.shape.state_shapes()
        return torch.zeros(conv_shape, device=device), torch.zeros(ssm_shape, device=device)

    # --- pieces shared by every path -------------------------------------------------------

    def _split(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[..., 2e + 2gn + h] -> z [..., e], xBC [..., m], dt_raw [..., h]."""
        return torch.split(zxbcdt, [self.e, self.m, self.h], dim=-1)

    def _ssm_inputs(self, xBC: Tensor, dt_raw: Tensor) -> tuple[Tensor, ...]:
        """Conv output [..., m], dt_raw [..., h] -> x [..., h, p], dt [..., h], B, C [..., h, n]."""
        s = self.shape
        gn = s.ngroups * s.d_state
        x, B, C = torch.split(xBC.float(), [self.e, gn, gn], dim=-1)
        lead = x.shape[:-1]
        x = x.reshape(*lead, self.h, s.headdim)  # [..., h, p]
        heads_per_group = self.h // s.ngroups
        B = B.reshape(*lead, s.ngroups, s.d_state).repeat_interleave(heads_per_group, dim=-2)
        C = C.reshape(*lead, s.ngroups, s.d_state).repeat_interleave(heads_per_group, dim=-2)
        dt = F.softplus(dt_raw.float() + self.dt_bias.float())  # [..., h]
        return x, dt.clamp(*self.dt_limit), B, C

    def _output(self, y: Tensor, x: Tensor, z: Tensor) -> Tensor:
        """Scan output y [..., h, p] + D skip, gate with z [..., e], project to [..., d]."""
        y = y + self.D.float()[:, None] * x  # [..., h, p]
        y = y.flatten(-2).to(z.dtype)  # [..., e]
        return self.out_proj(self.norm(y, z))  # [..., d]

    def _conv(self, xBC: Tensor, conv_state: Tensor) -> tuple[Tensor, Tensor]:
        """Causal depthwise conv over a chunk: xBC [l, m], state [m, k - 1].

        Returns (SiLU(conv) [l, m], padded inputs [m, k - 1 + l]); the state after token t
        (1-based) is `padded[:, t : t + k - 1]`.
        """
        padded = torch.cat((conv_state.to(xBC.dtype), xBC.t()), dim=1)  # [m, k - 1 + l]
        out = F.conv1d(
            padded[None], self.conv_weight[:, None, :], self.conv_bias, groups=self.m
        )  # [1, m, l]
        return F.silu(out[0].t()), padded  # [l, m]

    # --- the three paths ---------------------------------------------------------------------

    def prefill(self, u: Tensor, state: MambaState, save_offsets: list[int]) -> MambaPrefill:
        """A chunk u [l, d] from `state`; hands back the state after l and after each offset.

        One scan over the chunk yields the state at every offset (`chunked_scan`), on its chunk
        grid or not, exactly.
        """
        length = u.shape[0]
        k1 = self.shape.d_conv - 1
        z, xBC, dt_raw = self._split(self.in_proj(u))  # [l, e], [l, m], [l, h]
        xBC, padded = self._conv(xBC, state[0])  # [l, m], [m, k - 1 + l]
        x, dt, B, C = self._ssm_inputs(xBC, dt_raw)  # [l, h, p], [l, h], [l, h, n] x2
        A = -torch.exp(self.A_log.float())  # [h]
        y, ssm, at = chunked_scan(
            x, dt, A, B, C, state[1].float(), self.shape.chunk_size, save_offsets
        )  # [l, h, p]

        def saved(offset: int, ssm_state: Tensor) -> MambaState:
            return padded[:, offset : offset + k1].float().clone(), ssm_state

        states = {o: saved(o, at[o]) for o in save_offsets}
        return MambaPrefill(self._output(y, x, z), saved(length, ssm), states)

    def step(self, u: Tensor, state: MambaState) -> tuple[Tensor, MambaState]:
        """One token per sequence: u [b, d], conv [b, m, k - 1], ssm [b, h, p, n]."""
        z, xBC, dt_raw = self._split(self.in_proj(u))  # [b, e], [b, m], [b, h]
        window = torch.cat((state[0].to(xBC.dtype), xBC[:, :, None]), dim=2)  # [b, m, k]
        conv = (window * self.conv_weight).sum(dim=-1)  # [b, m]
        if self.conv_bias is not None:
            conv = conv + self.conv_bias
        x, dt, B, C = self._ssm_inputs(F.silu(conv), dt_raw)  # [b, h, p], [b, h], [b, h, n]
        A = -torch.exp(self.A_log.float())  # [h]
        y, ssm = ssm_step(state[1].float(), x, dt, A, B, C)  # [b, h, p], [b, h, p, n]
        return self._output(y, x, z), (window[:, :, 1:].float(), ssm)

    def forward_reference(self, u: Tensor) -> Tensor:
        """u [l, d] from the zero state through the sequential scan -> [l, d]."""
        conv_state, ssm = self.zero_state(u.device)
        z, xBC, dt_raw = self._split(self.in_proj(u))
        xBC, _ = self._conv(xBC, conv_state)
        x, dt, B, C = self._ssm_inputs(xBC, dt_raw)
        y, _ = sequential_scan(x, dt, -torch.exp(self.A_log.float()), B, C, ssm)
        return self._output(y, x, z)
