"""The gated delta rule (Gated DeltaNet's recurrence), as a one-token step and in chunks.

Glossary (one sequence; a leading `b` where a batch of sequences steps together):
    l   tokens                      h   heads (the value heads; q and k already repeated to them)
    dk  key head dim                dv  value head dim
    c   chunk length                z   chunk index, nz = ceil(l / c)
    i,j token positions inside a chunk (i the output, j the input)
    q,k [l, h, dk]  queries, keys (L2-normalised; q also scaled by dk^-0.5), v [l, h, dv]
    g   [l, h]  log decay (<= 0)    beta [l, h]  write strength in (0, 1)
    S   [h, dk, dv]  the state: a map from keys to values

The rule, per head (decay, then a delta-rule write of what S mispredicts for k_t, then a read):
    S'_t = exp(g_t) S_{t-1}
    S_t  = S'_t + k_t (outer) beta_t (v_t - S'_t^T k_t)
    o_t  = S_t^T q_t

`recurrent_step` is the rule for one token; `sequential_rule` loops it and is the reference.
`chunked_rule` computes the same thing in blocks of `c` tokens. Inside a chunk the writes
u_i = beta_i (v_i - S'_i^T k_i) depend on one another through S'; they solve one unit lower
triangular system per chunk (the UT / WY form), split into a part from the chunk's own tokens and
a part linear in the state S0 the chunk starts from:
    (I + A) U = beta V - beta exp(G) K S0,   A_ij = beta_i exp(G_i - G_j) (k_i . k_j), j < i
with G the cumulative log decay from the chunk's start. Across chunks S is carried by the step
rule at chunk granularity: S_end = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j (outer) u_j.
Read `recurrent_step` and the chunk loop of `chunked_rule` side by side. The scan of Mamba-2
(`engine.model.ssd`) has the same two forms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def recurrent_step(
    state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor
) -> tuple[Tensor, Tensor]:
    """One token for a batch: S [b, h, dk, dv], q, k [b, h, dk], v [b, h, dv], g, beta [b, h].

    Returns (o [b, h, dv], new S [b, h, dk, dv]).
    """
    state = torch.exp(g)[:, :, None, None] * state  # [b, h, dk, dv]: S'
    predicted = torch.einsum("bhkv,bhk->bhv", state, k)  # [b, h, dv]: S'^T k
    write = beta[:, :, None] * (v - predicted)  # [b, h, dv]
    state = state + k[:, :, :, None] * write[:, :, None, :]  # [b, h, dk, dv]
    o = torch.einsum("bhkv,bhk->bhv", state, q)  # [b, h, dv]
    return o, state


def sequential_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor
) -> tuple[Tensor, Tensor]:
    """The reference: `recurrent_step` token by token. Returns (o [l, h, dv], final S)."""
    state = initial_state[None]  # [1, h, dk, dv]
    outs = []
    for t in range(q.shape[0]):
        o, state = recurrent_step(
            state, q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1]
        )
        outs.append(o[0])  # [h, dv]
    o = torch.stack(outs) if outs else v.new_zeros(v.shape)  # [l, h, dv]
    return o, state[0]


def chunked_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor,
    chunk_size: int = 64,
    offsets: Sequence[int] = (),
) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
    """The same result as `sequential_rule`, in chunks. Returns (o [l, h, dv], final S, and
    S after each of `offsets`, token counts in 0..l). An offset on the chunk grid is read off
    the carry across chunks at no extra cost; one inside chunk z is chunk z's carried-in state
    decayed to it plus the chunk's own writes up to it, the step rule over a part of a chunk."""
    length, h, dk = k.shape
    dv = v.shape[-1]
    if length == 0:
        return v.new_zeros(v.shape), initial_state, dict.fromkeys(offsets, initial_state)
    c = chunk_size
    nz = -(-length // c)
    pad = nz * c - length

    # Padding tokens have g = 0 and beta = 0: decay 1 and no write, so they leave S unchanged.
    def by_chunk(x: Tensor) -> Tensor:  # [l, h, e] -> [nz, h, c, e]
        x = x if pad == 0 else F.pad(x, (0, 0, 0, 0, 0, pad))  # [nz * c, h, e]
        return x.view(nz, c, h, x.shape[-1]).transpose(1, 2).contiguous()

    q, k, v = by_chunk(q), by_chunk(k), by_chunk(v)  # [nz, h, c, dk], [.., dk], [.., dv]
    g, beta = by_chunk(g[..., None])[..., 0], by_chunk(beta[..., None])[..., 0]  # [nz, h, c]

    G = torch.cumsum(g, dim=-1)  # [nz, h, c]: log of the decay from the chunk's start to i
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # [c, c], j <= i
    pair = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf"))
    decay = torch.exp(pair)  # [nz, h, c(i), c(j)]: exp(G_i - G_j) for j <= i, else 0

    # The writes: (I + A) U = beta V - (beta exp(G) K) S0, solved once per chunk for both parts.
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)  # [nz, h, c, c]
    system = A + torch.eye(c, dtype=A.dtype, device=A.device)  # [nz, h, c, c]
    rhs = torch.cat((beta[..., None] * v, (beta * torch.exp(G))[..., None] * k), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    own, per_state = solved.split([dv, dk], dim=-1)  # [nz, h, c, dv], [nz, h, c, dk]
    # U = own - per_state @ S0, for the S0 each chunk starts from

    # Across chunks: the step rule with a whole chunk as the step.
    k_to_end = k * torch.exp(G[..., -1:] - G)[..., None]  # [nz, h, c, dk]
    chunk_decay = torch.exp(G[..., -1])[..., None, None]  # [nz, h, 1, 1]
    state = initial_state
    states_in, writes = [], []
    for z in range(nz):
        states_in.append(state)
        u = own[z] - per_state[z] @ state  # [h, c, dv]
        writes.append(u)
        state = chunk_decay[z] * state + k_to_end[z].transpose(-1, -2) @ u  # [h, dk, dv]
    states_in = torch.stack(states_in)  # [nz, h, dk, dv]: S at each chunk's start
    U = torch.stack(writes)  # [nz, h, c, dv]

    # o_i = exp(G_i) S0^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) u_j
    scores = (q @ k.transpose(-1, -2)) * decay  # [nz, h, c, c]
    o = (q * torch.exp(G)[..., None]) @ states_in + scores @ U  # [nz, h, c, dv]
    o = o.transpose(1, 2).reshape(nz * c, h, dv)[:length]  # [l, h, dv]

    def state_at(offset: int) -> Tensor:
        z, r = divmod(offset, c)
        if offset == length:
            return state
        if r == 0:  # S after z chunks is S at the start of chunk z
            return states_in[z]
        to_offset = torch.exp(G[z, :, r - 1 : r] - G[z, :, :r])[..., None]  # [h, r, 1]
        own = (k[z, :, :r] * to_offset).transpose(-1, -2) @ U[z, :, :r]  # [h, dk, dv]
        return torch.exp(G[z, :, r - 1])[:, None, None] * states_in[z] + own

    return o, state, {offset: state_at(offset) for offset in offsets}
