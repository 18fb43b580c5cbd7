"""Grouped-KV causal self-attention, with RoPE or no position embedding, over a paged KV cache.

Glossary:
    l   tokens of a prefill chunk   b   sequences in a decode step
    t   context tokens attended over (positions 0 .. start + l - 1, or 0 .. position)
    d   model width                 dh  head dim
    H   query heads                 K   KV heads, each shared by G = H / K query heads

The cache of one layer is a pair (k_cache, v_cache), each [num_blocks, block_size, K, dh].
Slots are flat: `block_id * block_size + offset`, so both caches are read and written through a
`[num_blocks * block_size, K, dh]` view. Keys are stored already rotated, so a cached key is
valid for any later query, whichever chunk wrote it.

Scores are `scale * q . k` with `scale = dh^-0.5` unless the model sets its own (Granite's
attention multiplier). Without RoPE (`rope_theta` None) the causal mask alone orders tokens.

Two details of Qwen3.5 / Qwen3-Next ("gated attention"): `qk_norm` RMS-normalises each query
and key head before RoPE, and `output_gate` makes q_proj emit, per head, the query and then a
gate of dh values; the attention output is multiplied by `sigmoid(gate)` before o_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.norm import RMSNorm
from engine.model.rope import RotaryEmbedding

KVCache = tuple[Tensor, Tensor]  # (k_cache, v_cache), each [num_blocks, block_size, K, dh]

# Bounds on the scratch of one attention call, in score elements (float32: 4 bytes each).
PREFILL_SCORE_BUDGET = 1 << 25
DECODE_GATHER_BUDGET = 1 << 19  # padded context tokens gathered at once in decode


def flat_view(cache: Tensor) -> Tensor:
    """[num_blocks, block_size, K, dh] -> [slots, K, dh], a view: writes land in the cache."""
    return cache.view(-1, *cache.shape[2:])


def sdpa(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """`scaled_dot_product_attention` over [H, l, dh] with a batch axis of one added: the fused
    kernels (flash on the CPU too) take only 4-d inputs, 3-d ones fall to the slow math path."""
    return F.scaled_dot_product_attention(q[None], k[None], v[None], **kwargs)[0]


class Attention(nn.Module):
    def __init__(
        self,
        d: int,
        num_heads: int,
        num_kv_heads: int,
        rope_theta: float | None,
        *,
        head_dim: int | None = None,
        bias: bool = False,
        scale: float | None = None,
        rotary_dim: int | None = None,
        output_gate: bool = False,
        qk_norm: tuple[float, float] | None = None,
    ) -> None:
        """`qk_norm`: (eps, weight offset) of the per-head query and key norms, or None."""
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not share {num_kv_heads} KV heads evenly")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d // num_heads if head_dim is None else head_dim
        self.group = num_heads // num_kv_heads
        self.scale = self.head_dim**-0.5 if scale is None else scale
        self.output_gate = output_gate
        self.q_proj = nn.Linear(d, (2 if output_gate else 1) * num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, d, bias=bias)
        if qk_norm is not None:
            eps, offset = qk_norm
            self.q_norm = RMSNorm(self.head_dim, eps, offset)
            self.k_norm = RMSNorm(self.head_dim, eps, offset)
        else:
            self.q_norm = self.k_norm = None
        self.rope = (
            None
            if rope_theta is None
            else RotaryEmbedding(self.head_dim, rope_theta, rotary_dim=rotary_dim)
        )

    def reset_parameters(self, generator: torch.Generator, out_scale: float) -> None:
        d = self.q_proj.in_features
        with torch.no_grad():
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                proj.weight.normal_(0.0, d**-0.5, generator=generator)
            self.o_proj.weight.normal_(0.0, out_scale * d**-0.5, generator=generator)

    def _qkv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x [l, d] at positions [l] -> rotated q [l, H, dh], rotated k [l, K, dh], v [l, K, dh]
        and the output gate [l, H * dh] (None without one)."""
        q = self.q_proj(x).view(x.shape[0], self.num_heads, -1)  # [l, H, (2)dh]
        gate = None
        if self.output_gate:
            q, gate = q.chunk(2, dim=-1)  # [l, H, dh] each
            gate = gate.reshape(x.shape[0], -1)  # [l, H * dh]
        k = self.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope.apply(q, positions), self.rope.apply(k, positions)
        return q, k, v, gate

    def _out(self, out: Tensor, gate: Tensor | None) -> Tensor:
        """Attention output [l, H * dh], gated if the model gates it -> o_proj -> [l, d]."""
        return self.o_proj(out if gate is None else out * torch.sigmoid(gate))

    def _write(self, cache: KVCache, slots: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        k_flat, v_flat = flat_view(cache[0]), flat_view(cache[1])
        k_flat[slots] = k.to(k_flat.dtype)
        v_flat[slots] = v.to(v_flat.dtype)
        return k_flat, v_flat

    def prefill(
        self, x: Tensor, start: int, cache: KVCache, write_slots: Tensor, context_slots: Tensor
    ) -> Tensor:
        """A chunk x [l, d] at positions start.. -> [l, d], its K/V written at write_slots.

        From position 0 the mask is plain causal, which the fused kernels (flash on the CPU
        too) apply without scores in memory and skipping the masked half. After a cached
        prefix the mask is offset, and queries go in tiles so the scores stay within
        PREFILL_SCORE_BUDGET for any context.
        """
        length = x.shape[0]
        positions = torch.arange(start, start + length, device=x.device)  # [l]
        q, k, v, gate = self._qkv(x, positions)
        k_flat, v_flat = self._write(cache, write_slots, k, v)
        keys = k_flat[context_slots].to(q.dtype).transpose(0, 1)  # [K, t, dh]
        values = v_flat[context_slots].to(q.dtype).transpose(0, 1)  # [K, t, dh]
        keys = keys.repeat_interleave(self.group, dim=0)  # [H, t, dh]
        values = values.repeat_interleave(self.group, dim=0)  # [H, t, dh]
        q = q.transpose(0, 1)  # [H, l, dh]
        if start == 0:
            out = sdpa(q, keys, values, is_causal=True, scale=self.scale)  # [H, l, dh]
            return self._out(out.transpose(0, 1).reshape(length, -1), gate)  # [l, d]
        t = keys.shape[1]
        key_positions = torch.arange(t, device=x.device)  # [t]
        tile = max(16, PREFILL_SCORE_BUDGET // (self.num_heads * t))
        out = torch.empty_like(q)  # [H, l, dh]
        for lo in range(0, length, tile):
            hi = min(length, lo + tile)
            # Keys past the tile's last query are masked for every query in it: leave them out,
            # which halves the work of a long causal chunk.
            reach = start + hi
            mask = key_positions[None, :reach] <= positions[lo:hi, None]  # [hi - lo, reach]
            out[:, lo:hi] = sdpa(
                q[:, lo:hi], keys[:, :reach], values[:, :reach], attn_mask=mask, scale=self.scale
            )
        return self._out(out.transpose(0, 1).reshape(length, -1), gate)  # [l, d]

    def decode(
        self,
        x: Tensor,
        positions: Tensor,
        cache: KVCache,
        write_slots: Tensor,
        context_slots: list[Tensor],
    ) -> Tensor:
        """One token per sequence, x [b, d] -> [b, d]; contexts of different lengths.

        Sequences go in groups whose padded context stays within DECODE_GATHER_BUDGET; inside
        a group, contexts are padded to the longest and the padding is masked out.
        """
        b = x.shape[0]
        q, k, v, gate = self._qkv(x, positions)  # [b, H, dh], [b, K, dh] x2, [b, H * dh]
        k_flat, v_flat = self._write(cache, write_slots, k, v)
        q = q.view(b, self.num_kv_heads, self.group, self.head_dim)  # [b, K, G, dh]
        out = torch.empty_like(q)
        lengths = [len(slots) for slots in context_slots]
        lo = 0
        while lo < b:
            hi = lo + 1
            while hi < b and (hi + 1 - lo) * max(lengths[lo : hi + 1]) <= DECODE_GATHER_BUDGET:
                hi += 1
            out[lo:hi] = self._attend_padded(q[lo:hi], k_flat, v_flat, context_slots[lo:hi])
            lo = hi
        return self._out(out.reshape(b, -1), gate)  # [b, d]

    def _attend_padded(
        self, q: Tensor, k_flat: Tensor, v_flat: Tensor, context_slots: list[Tensor]
    ) -> Tensor:
        """q [b, K, G, dh] over each sequence's own context -> [b, K, G, dh]."""
        slots = nn.utils.rnn.pad_sequence(context_slots, batch_first=True)  # [b, t]
        lengths = torch.tensor([len(s) for s in context_slots], device=q.device)  # [b]
        valid = torch.arange(slots.shape[1], device=q.device)[None, :] < lengths[:, None]
        keys = k_flat[slots].to(q.dtype)  # [b, t, K, dh]
        values = v_flat[slots].to(q.dtype)  # [b, t, K, dh]
        scores = torch.einsum("bkgd,btkd->bkgt", q, keys) * self.scale  # [b, K, G, t]
        scores = scores.float().masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)  # [b, K, G, t]
        return torch.einsum("bkgt,btkd->bkgd", probs, values)  # [b, K, G, dh]

    def forward_reference(self, x: Tensor) -> Tensor:
        """Whole sequence x [l, d] at positions 0.., no cache -> [l, d]."""
        length = x.shape[0]
        q, k, v, gate = self._qkv(x, torch.arange(length, device=x.device))
        k = k.repeat_interleave(self.group, dim=1)  # [l, H, dh]
        v = v.repeat_interleave(self.group, dim=1)  # [l, H, dh]
        out = sdpa(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            is_causal=True,
            scale=self.scale,
        )  # [H, l, dh]
        return self._out(out.transpose(0, 1).reshape(length, -1), gate)
