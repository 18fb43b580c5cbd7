"""The checkpoint families, each as a Junction stack plus the name map of its weights.

Every family becomes a `HybridStack` of pre-norm residual blocks. A checkpoint layer that holds
a mixer and a feed-forward (Bamba, Granite) becomes two blocks; a Nemotron-H layer, which holds
one of the four, becomes one:

    Bamba      layer = [mamba | attention (RoPE on half of each head)] + SwiGLU MLP; untied head
    Granite    layer = [mamba | attention (RoPE or none)] + (MoE + shared MLP | shared MLP);
               embedding x embedding_multiplier, both residuals x residual_multiplier,
               attention scores x attention_multiplier, logits / logits_scaling
    Nemotron-H pattern over M (mamba) * (attention, no RoPE) - (ReLU^2 MLP) E (MoE: sigmoid
               router with a score bias, ReLU^2 experts, shared expert); gated norm per group
    Qwen3.5,   Gated DeltaNet hybrids: `engine.model.hf.qwen`
    Qwen3-Next

Junction's scan is exact at any chunk length, so the checkpoint's `chunk_size` (a speed knob
of the reference) is not used; the Mamba layers keep Junction's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from engine.model.hf.builders import (
    Built,
    NameMap,
    attention,
    finish,
    ibm_mamba,
    mamba,
    require,
)
from engine.model.hf.config import DTYPES, HFModelSpec, load_spec
from engine.model.hf.qwen import qwen
from engine.model.hf.weights import Source, load_weights
from engine.model.hybrid import HybridStack
from engine.model.mlp import MLP
from engine.model.moe import MoE


def bamba(spec: HFModelSpec) -> Built:
    c = spec.hf_config
    eps = c.rms_norm_eps
    names = NameMap(spec.hidden_size)
    for i, kind in enumerate(spec.layer_kinds):
        layer = f"model.layers.{i}"
        if kind == "attention":
            mixer = attention(spec, rope=True, bias=c.attention_bias)
            names.add(mixer, f"{layer}.input_layernorm.weight", f"{layer}.self_attn", eps=eps)
        else:
            mixer, renames = ibm_mamba(spec, f"{layer}.mamba")
            names.add(
                mixer, f"{layer}.input_layernorm.weight", f"{layer}.mamba", eps=eps, renames=renames
            )
        ffn = f"{layer}.feed_forward"
        mlp = MLP(spec.hidden_size, c.intermediate_size, c.hidden_act, bias=c.mlp_bias)
        gate_up = {
            f"up_proj.{p}": Source((f"{ffn}.gate_proj.{p}", f"{ffn}.up_proj.{p}"), "cat")
            for p in ("weight", "bias")
        }
        names.add(mlp, f"{layer}.pre_ff_layernorm.weight", ffn, eps=eps, renames=gate_up)
    return finish(spec, names, "model.embed_tokens.weight", "model.final_layernorm.weight")


def granite(spec: HFModelSpec) -> Built:
    c = spec.hf_config
    eps, scale = c.rms_norm_eps, c.residual_multiplier
    names = NameMap(spec.hidden_size)
    shared_names = {
        "up_proj.weight": "input_linear.weight",
        "down_proj.weight": "output_linear.weight",
    }
    for i, kind in enumerate(spec.layer_kinds):
        layer = f"model.layers.{i}"
        norm = f"{layer}.input_layernorm.weight"
        renames: dict[str, str | Source]
        if kind == "attention":
            mixer = attention(
                spec,
                rope=c.position_embedding_type == "rope",
                bias=c.attention_bias,
                scale=c.attention_multiplier,
            )
            names.add(mixer, norm, f"{layer}.self_attn", eps=eps, residual_scale=scale)
        else:
            mixer, renames = ibm_mamba(spec, f"{layer}.mamba")
            names.add(mixer, norm, f"{layer}.mamba", eps=eps, residual_scale=scale, renames=renames)
        norm = f"{layer}.post_attention_layernorm.weight"
        shared = MLP(spec.hidden_size, c.shared_intermediate_size, c.hidden_act)
        if spec.ffn_kind == "mlp":
            renames = dict(shared_names)
            names.add(
                shared, norm, f"{layer}.shared_mlp", eps=eps, residual_scale=scale, renames=renames
            )
            continue
        moe = MoE(
            spec.hidden_size,
            c.num_local_experts,
            c.num_experts_per_tok,
            c.intermediate_size,
            act=c.hidden_act,
            shared=shared,
        )
        experts = f"{layer}.block_sparse_moe"
        renames = {
            "router": "router.layer.weight",
            "up_proj": "input_linear.weight",
            "down_proj": "output_linear.weight",
        }
        renames |= {
            f"shared.{ours}": Source((f"{layer}.shared_mlp.{theirs}",))
            for ours, theirs in shared_names.items()
        }
        names.add(moe, norm, experts, eps=eps, residual_scale=scale, renames=renames)
    return finish(
        spec,
        names,
        "model.embed_tokens.weight",
        "model.norm.weight",
        embedding_scale=c.embedding_multiplier,
        logits_divisor=c.logits_scaling,
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


FAMILIES: dict[str, Callable[[HFModelSpec], Built]] = {
    "BambaForCausalLM": bamba,
    "GraniteMoeHybridForCausalLM": granite,
    "NemotronHForCausalLM": nemotron_h,
    "Qwen3_5ForCausalLM": qwen,
    "Qwen3_5MoeForCausalLM": qwen,
    "Qwen3NextForCausalLM": qwen,
    "Qwen3_5ForConditionalGeneration": qwen,
    "Qwen3_5MoeForConditionalGeneration": qwen,
}

#: stored tensors no family reads: Nemotron-H's multi-token-prediction layers
IGNORED = [r"^mtp\."]


def load_hf_model(
    model_dir: Path, dtype: str = "float32", device: torch.device | str | None = None
) -> HybridStack:
    """The checkpoint in `model_dir` as a Junction model in eval mode; its spec is `.spec`.

    Every config and weight check runs here, before the model can serve a request.
    """
    model_dir = Path(model_dir)
    spec = load_spec(model_dir)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    with torch.device("meta"):  # no memory and no init until the weights are read
        model, sources, ignored = FAMILIES[spec.architecture](spec)
    model = model.to(DTYPES[dtype]).to_empty(device=device or "cpu")
    load_weights(model, sources, model_dir, ignored + IGNORED)
    model.spec = spec
    return model.eval()
