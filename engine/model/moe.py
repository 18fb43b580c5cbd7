"""Mixture of experts: a router picks `k` of `E` expert MLPs per token, plus a shared MLP.

Glossary:
    t   tokens            d   model width        d'  expert width (d, or a latent size)
    E   routed experts    k   experts per token  f   expert inner width

Two routers, as the checkpoints define them:
    softmax  (Granite, Qwen) top-k of the logits, weights = softmax over those k logits (which is
                          the softmax over all E, renormalised over the k); with `normalize`
                          off (Qwen3-Next's norm_topk_prob false), the k of the softmax over all E
    sigmoid  (Nemotron-H) scores = sigmoid(logits); experts chosen by scores + a learned bias,
                          within the best `top_groups` of `num_groups` expert groups; weights are
                          the chosen scores, normalised to sum 1 if asked, times `routed_scale`
Routing and the weighted sum run in float32. Experts add in ascending expert order.
The shared MLP's output is scaled by `sigmoid(shared_gate(x))` when the model gates it (Qwen).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.mlp import MLP, activation

Routing = Literal["softmax", "sigmoid"]


class Route(NamedTuple):
    expert_ids: Tensor  # [t, k] long
    weights: Tensor  # [t, k] float32


class MoE(nn.Module):
    def __init__(
        self,
        d: int,
        num_experts: int,
        top_k: int,
        inner: int,
        *,
        act: str = "silu",
        gated: bool = True,
        routing: Routing = "softmax",
        num_groups: int = 1,
        top_groups: int = 1,
        normalize: bool = True,
        routed_scale: float = 1.0,
        shared: MLP | None = None,
        latent: int | None = None,
        latent_bias: bool = False,
        shared_gate: bool = False,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts or num_experts % num_groups:
            raise ValueError(
                f"{num_experts} experts in {num_groups} groups cannot route {top_k} per token"
            )
        self.top_k = top_k
        self.gated = gated
        self.act = activation(act)
        self.routing = routing
        self.num_groups, self.top_groups = num_groups, top_groups
        self.normalize, self.routed_scale = normalize, routed_scale
        self.router = nn.Parameter(torch.empty(num_experts, d))  # [E, d]
        self.score_bias = nn.Parameter(torch.zeros(num_experts)) if routing == "sigmoid" else None
        width = latent or d
        self.latent_in = nn.Linear(d, latent, bias=latent_bias) if latent else None
        self.latent_out = nn.Linear(latent, d, bias=latent_bias) if latent else None
        rows = (2 if gated else 1) * inner
        self.up_proj = nn.Parameter(torch.empty(num_experts, rows, width))  # [E, (2)f, d']
        self.down_proj = nn.Parameter(torch.empty(num_experts, width, inner))  # [E, d', f]
        self.shared = shared
        self.shared_gate = nn.Linear(d, 1, bias=False) if shared_gate else None

    def route(self, x: Tensor) -> Route:
        """x [t, d] -> the k experts of each token and their weights."""
        if self.routing == "softmax":
            logits = F.linear(x, self.router).float()  # [t, E]
            top, expert_ids = logits.topk(self.top_k, dim=-1)  # [t, k]
            if self.normalize:
                return Route(expert_ids, torch.softmax(top, dim=-1))
            return Route(expert_ids, torch.softmax(logits, dim=-1).gather(1, expert_ids))
        scores = F.linear(x.float(), self.router.float()).sigmoid()  # [t, E]
        choice = scores + self.score_bias.float()  # [t, E]
        grouped = choice.unflatten(-1, (self.num_groups, -1))  # [t, groups, E / groups]
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        best = group_scores.topk(self.top_groups, dim=-1).indices  # [t, top_groups]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(-2)  # [t, E]
        expert_ids = choice.topk(self.top_k, dim=-1).indices  # [t, k]
        weights = scores.gather(1, expert_ids)  # [t, k]
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return Route(expert_ids, weights * self.routed_scale)

    def _experts(self, x: Tensor, route: Route) -> Tensor:
        """x [t, d'] -> the routed experts' weighted sum [t, d'] (float32)."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [t, d']
        for expert in route.expert_ids.unique().tolist():
            tokens, slot = torch.where(route.expert_ids == expert)  # [u] each
            up = F.linear(x[tokens], self.up_proj[expert])  # [u, (2)f]
            if self.gated:
                gate, up = up.chunk(2, dim=-1)
                hidden = self.act(gate) * up
            else:
                hidden = self.act(up)
            y = F.linear(hidden, self.down_proj[expert])  # [u, d']
            out.index_add_(0, tokens, y.float() * route.weights[tokens, slot, None])
        return out

    def forward(self, x: Tensor) -> Tensor:  # [t, d] -> [t, d]
        route = self.route(x)
        inner = x if self.latent_in is None else self.latent_in(x)  # [t, d']
        y = self._experts(inner, route).to(x.dtype)
        if self.latent_out is not None:
            y = self.latent_out(y)  # [t, d]
        if self.shared is not None:
            shared = self.shared(x)  # [t, d]
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            y = y + shared
        return y
