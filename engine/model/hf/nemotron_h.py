"""Nemotron-H as a Junction stack plus the name map of its weights. A Nemotron-H layer holds
one of four kinds, so it becomes one block: its pattern is over

    M (mamba) * (attention, no RoPE) - (ReLU^2 MLP) E (MoE: sigmoid router with a score bias,
    ReLU^2 experts, shared expert); gated norm per group
"""

from __future__ import annotations

from torch import nn

from engine.model.hf.builders import Built, NameMap, attention, finish, mamba, require
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import MambaStateShape, StateFields
from engine.model.hf.weights import Source
from engine.model.mlp import MLP
from engine.model.moe import MoE

NEMOTRON_H_STATE = StateFields(
    "mamba",
    MambaStateShape,
    ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel"),
    ("mamba_num_heads", "n_groups"),
    "Mamba B/C groups",
)


def nemotron_h(spec: HFModelSpec) -> Built:
    c = spec.hf_config
    eps = c.layer_norm_epsilon
    require(not c.sliding_window, spec, "sliding-window attention is not supported")
    names = NameMap(spec.hidden_size)
    for i, kind in enumerate(spec.layer_kinds):
        layer = f"backbone.layers.{i}"
        norm, prefix = f"{layer}.norm.weight", f"{layer}.mixer"
        renames: dict[str, str | Source] = {}
        if kind == "attention":
            mixer: nn.Module = attention(spec, rope=False, bias=False)
        elif kind == "mamba":
            mixer, renames = mamba(
                spec,
                prefix,
                act=c.mamba_hidden_act,
                bias=c.use_bias,
                conv_bias=c.use_conv_bias,
                eps=eps,
                norm_groups=spec.mamba.num_groups,
                dt_limit=(c.time_step_min, float("inf")),
            )
        elif kind == "mlp":
            mixer = MLP(spec.hidden_size, c.intermediate_size, c.mlp_hidden_act, False, c.mlp_bias)
        else:
            mixer, renames = nemotron_moe(spec, prefix)
        names.add(mixer, norm, prefix, eps=eps, renames=renames)
    return finish(spec, names, "backbone.embeddings.weight", "backbone.norm_f.weight")


def nemotron_moe(spec: HFModelSpec, prefix: str) -> tuple[MoE, dict[str, str | Source]]:
    c = spec.hf_config
    shared = MLP(
        spec.hidden_size, c.moe_shared_expert_intermediate_size, c.mlp_hidden_act, False, c.mlp_bias
    )
    moe = MoE(
        spec.hidden_size,
        c.n_routed_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
        act=c.mlp_hidden_act,
        gated=False,
        routing="sigmoid",
        num_groups=c.n_group,
        top_groups=c.topk_group,
        normalize=c.norm_topk_prob,
        routed_scale=c.routed_scaling_factor,
        shared=shared,
        latent=c.moe_latent_size,
        latent_bias=c.mlp_bias,
    )
    experts = range(c.n_routed_experts)
    renames: dict[str, str | Source] = {
        "router": "gate.weight",
        "score_bias": "gate.e_score_correction_bias",
        "up_proj": Source(tuple(f"{prefix}.experts.{e}.up_proj.weight" for e in experts), "stack"),
        "down_proj": Source(
            tuple(f"{prefix}.experts.{e}.down_proj.weight" for e in experts), "stack"
        ),
    }
    submodules = {
        "shared": "shared_experts",
        "latent_in": "fc1_latent_proj",
        "latent_out": "fc2_latent_proj",
    }
    for local, _ in moe.named_parameters():
        head, _, rest = local.partition(".")
        if head in submodules:
            renames[local] = f"{submodules[head]}.{rest}"
    return moe, renames
