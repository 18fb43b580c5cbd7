"""The Mamba-2 state-space recurrence (SSD), as a one-token step and as a chunked scan.

Glossary (one sequence; a leading `b` where a batch of sequences steps together):
    l   tokens                      h   heads                 p   head dim (headdim)
    n   state size (d_state)        c   chunk length          z   chunk index, nz = ceil(l / c)
    i,j token positions inside a chunk (i the output, j the input)
    x   [l, h, p]  inputs           dt  [l, h]  step sizes (after softplus, > 0)
    A   [h]        decay rates (< 0)
    B   [l, h, n]  input maps       C   [l, h, n]  output maps (groups already expanded to heads)
    S   [h, p, n]  the state

The recurrence, per head:
    S_t = exp(dt_t * A) * S_{t-1} + dt_t * x_t (outer) B_t
    y_t = S_t . C_t                 (contract n)
The skip `D * x` and the gate live in the mixer, not here.

`ssm_step` is the recurrence for one token; `sequential_scan` loops it and is the reference.
`chunked_scan` computes the same thing in blocks of `c` tokens: inside a chunk as one masked
(attention-like) product, across chunks by carrying `S` with the same step rule at chunk
granularity. Read the two side by side: the chunk loop at the bottom is `ssm_step` with the
chunk's total decay `exp(sum dt * A)` and the chunk's summed input `local_states`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def ssm_step(
    state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor
) -> tuple[Tensor, Tensor]:
    """One token for a batch: S [b, h, p, n], x [b, h, p], dt [b, h], B, C [b, h, n].

    Returns (y [b, h, p], new S [b, h, p, n]).
    """
    decay = torch.exp(dt * A)  # [b, h]
    update = (dt[:, :, None] * x)[:, :, :, None] * B[:, :, None, :]  # [b, h, p, n]
    state = decay[:, :, None, None] * state + update  # [b, h, p, n]
    y = torch.einsum("bhpn,bhn->bhp", state, C)  # [b, h, p]
    return y, state


def sequential_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, initial_state: Tensor
) -> tuple[Tensor, Tensor]:
    """The reference: `ssm_step` token by token. Returns (y [l, h, p], final S [h, p, n])."""
    state = initial_state[None]  # [1, h, p, n]
    ys = []
    for t in range(x.shape[0]):
        y, state = ssm_step(state, x[t : t + 1], dt[t : t + 1], A, B[t : t + 1], C[t : t + 1])
        ys.append(y[0])  # [h, p]
    y = torch.stack(ys) if ys else x.new_zeros(x.shape)  # [l, h, p]
    return y, state[0]


def chunked_scan(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    initial_state: Tensor,
    chunk_size: int = 64,
    offsets: Sequence[int] = (),
) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
    """The same result as `sequential_scan`, in chunks. Returns (y [l, h, p], final S, and
    S after each of `offsets`, token counts in 0..l). An offset on the chunk grid is read off
    the carry across chunks at no extra cost; one inside chunk z is chunk z's carried-in state
    decayed to it plus the chunk's own inputs up to it, the step rule over a part of a chunk."""
    length, h, p = x.shape
    if length == 0:
        return x.new_zeros(x.shape), initial_state, dict.fromkeys(offsets, initial_state)
    n = B.shape[-1]
    c = chunk_size
    nz = -(-length // c)
    pad = nz * c - length
    # Padding tokens have dt = 0: decay 1 and no input, so they leave S unchanged. (No pad, no
    # copy: a prompt of whole chunks is only reshaped.)
    x = _pad_tokens(x, pad).reshape(nz, c, h, p)
    dt = _pad_tokens(dt, pad).reshape(nz, c, h)
    B = _pad_tokens(B, pad).reshape(nz, c, h, n)
    C = _pad_tokens(C, pad).reshape(nz, c, h, n)

    log_decay = torch.cumsum(dt * A, dim=1)  # [nz, c, h]: log of the decay from chunk start

    # Inside a chunk: y_i = sum_{j <= i} exp(log_decay_i - log_decay_j) (C_i . B_j) dt_j x_j.
    segment = log_decay[:, :, None, :] - log_decay[:, None, :, :]  # [nz, c(i), c(j), h]
    causal = torch.ones(c, c, dtype=torch.bool, device=x.device).tril()  # [c, c]
    segment = segment.masked_fill(~causal[None, :, :, None], float("-inf"))
    weights = torch.einsum("zihn,zjhn->zijh", C, B) * torch.exp(segment)  # [nz, c, c, h]
    y_diag = torch.einsum("zijh,zjhp->zihp", weights, dt[..., None] * x)  # [nz, c, h, p]

    # What each chunk adds to S on its own (from a zero state), seen at the chunk's end.
    decay_to_end = torch.exp(log_decay[:, -1:, :] - log_decay)  # [nz, c, h]
    local_states = torch.einsum("zjh,zjhp,zjhn->zhpn", decay_to_end * dt, x, B)  # [nz, h, p, n]

    # Across chunks: the step rule with a whole chunk as the step.
    chunk_decay = torch.exp(log_decay[:, -1, :])  # [nz, h]
    state = initial_state
    states_in = []
    for z in range(nz):
        states_in.append(state)
        state = chunk_decay[z][:, None, None] * state + local_states[z]  # [h, p, n]
    states_in = torch.stack(states_in)  # [nz, h, p, n]: S at each chunk's start

    # The carried state's contribution: y_i += exp(log_decay_i) * (S_in . C_i).
    y_off = torch.einsum("zhpn,zihn->zihp", states_in, C) * torch.exp(log_decay)[..., None]
    y = (y_diag + y_off).reshape(nz * c, h, p)[:length]  # [l, h, p]

    def state_at(offset: int) -> Tensor:
        z, r = divmod(offset, c)
        if offset == length:
            return state
        if r == 0:  # S after z chunks is S at the start of chunk z
            return states_in[z]
        to_offset = torch.exp(log_decay[z, r - 1] - log_decay[z, :r])  # [r, h]
        own = torch.einsum("jh,jhp,jhn->hpn", to_offset * dt[z, :r], x[z, :r], B[z, :r])
        return torch.exp(log_decay[z, r - 1])[:, None, None] * states_in[z] + own  # [h, p, n]

    return y, state, {offset: state_at(offset) for offset in offsets}


def _pad_tokens(t: Tensor, pad: int) -> Tensor:
    """`t` [l, ...] with `pad` zero tokens appended (itself when there are none)."""
    return t if pad == 0 else F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad))
