"""Turning one position's logits into a token: greedy, temperature and top-p, seeded per request.

A request's draws depend only on its seed and the index of the token being drawn, so the same
request samples the same tokens however it is batched, chunked or served from the cache.
"""

from __future__ import annotations

import torch

from engine.request import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, output_index: int) -> int:
    """`logits` is `[vocab]`; returns the token id drawn for output number `output_index`."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # [vocab]
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest head whose mass reaches top_p (always at least one token)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    generator = torch.Generator(device="cpu")
    seed = params.seed if params.seed is not None else 0
    generator.manual_seed((seed * 1_000_003 + output_index) % (2**63))
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))
