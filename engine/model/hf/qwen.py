"""Qwen3.5 (dense and MoE, causal or as published with a vision tower) and Qwen3-Next: Gated
DeltaNet hybrids, three DeltaNet layers to one gated attention layer.

    layer = [Gated DeltaNet | gated attention (q/k norms, RoPE on part of each head, output
            gate)] + (SwiGLU MLP | MoE: softmax router, shared expert behind a sigmoid gate)

Every RMS norm scales by `1 + weight`. Qwen3-Next fuses the DeltaNet projections
(`in_proj_qkvz`, `in_proj_ba`) and mixes MLP and MoE layers; Qwen3.5 as published
(`...ForConditionalGeneration`) is served text only: its language model, stored under
`model.language_model`, without the vision tower. The DeltaNet states fill the cache's state
group (named `linear` on the pages) exactly as Mamba-2 states do.
"""

from __future__ import annotations

from engine.model.gdn import GatedDeltaNet
from engine.model.hf.builders import (
    Built,
    NameMap,
    attention,
    finish,
    gate_up,
    mamba_shape,
    require,
)
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import GDNStateShape, StateFields
from engine.model.hf.weights import Source
from engine.model.mlp import MLP
from engine.model.moe import MoE

QWEN_STATE = StateFields(
    "linear",
    GDNStateShape,
    (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ),
    ("linear_num_value_heads", "linear_num_key_heads"),
    "Gated DeltaNet key heads shared by value heads",
)


def qwen(spec: HFModelSpec) -> Built:
    """Qwen3.5 (dense and MoE) and Qwen3-Next: the layouts differ only where `fused` says."""
    c = spec.hf_config
    eps = c.rms_norm_eps
    fused = spec.architecture == "Qwen3NextForCausalLM"
    names = NameMap(spec.hidden_size, norm_offset=1.0)
    shape = mamba_shape(spec)
    model = spec.weights_prefix
    for i, kind in enumerate(spec.layer_kinds):
        layer = f"{model}.layers.{i}"
        norm = f"{layer}.input_layernorm.weight"
        if kind == "attention":
            mixer = attention(
                spec, rope=True, bias=c.attention_bias, output_gate=True, qk_norm=(eps, 1.0)
            )
            names.add(mixer, norm, f"{layer}.self_attn", eps=eps)
        else:
            prefix = f"{layer}.linear_attn"
            require(c.hidden_act == "silu", spec, f"activation {c.hidden_act!r} is not supported")
            mixer = GatedDeltaNet(shape, norm_eps=eps, fused=fused)
            conv = Source(
                (f"{prefix}.conv1d.weight",), shape=(shape.conv_dim, 1, shape.conv_kernel)
            )
            names.add(mixer, norm, prefix, eps=eps, renames={"conv_weight": conv})
        norm = f"{layer}.post_attention_layernorm.weight"
        ffn = f"{layer}.mlp"
        if qwen_moe_layer(spec, i):
            moe, renames = qwen_moe(spec, ffn)
            names.add(moe, norm, ffn, eps=eps, renames=renames)
        else:
            mlp = MLP(spec.hidden_size, c.intermediate_size, c.hidden_act)
            names.add(mlp, norm, ffn, eps=eps, renames=gate_up(ffn, "up_proj"))
    embedding, final_norm = f"{model}.embed_tokens.weight", f"{model}.norm.weight"
    return finish(spec, names, embedding, final_norm, norm_offset=1.0)


def qwen_moe_layer(spec: HFModelSpec, i: int) -> bool:
    """Qwen3.5-MoE routes in every layer; Qwen3-Next where its sparse step and list say."""
    c = spec.hf_config
    if spec.ffn_kind != "moe":
        return False
    if spec.architecture != "Qwen3NextForCausalLM":  # Qwen3.5-MoE, causal or multimodal
        return True
    return i not in (c.mlp_only_layers or []) and (i + 1) % c.decoder_sparse_step == 0


def qwen_moe(spec: HFModelSpec, prefix: str) -> tuple[MoE, dict[str, str | Source]]:
    c = spec.hf_config
    shared = MLP(spec.hidden_size, c.shared_expert_intermediate_size, c.hidden_act)
    moe = MoE(
        spec.hidden_size,
        c.num_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
        act=c.hidden_act,
        normalize=bool(getattr(c, "norm_topk_prob", True)),
        shared=shared,
        shared_gate=True,
    )
    experts = range(c.num_experts)
    up = tuple(
        f"{prefix}.experts.{e}.{proj}.weight" for e in experts for proj in ("gate_proj", "up_proj")
    )
    down = tuple(f"{prefix}.experts.{e}.down_proj.weight" for e in experts)
    renames: dict[str, str | Source] = {
        "router": "gate.weight",
        "up_proj": Source(up, "stack", per_item=2),
        "down_proj": Source(down, "stack"),
        "shared.down_proj.weight": "shared_expert.down_proj.weight",
        "shared_gate.weight": "shared_expert_gate.weight",
    }
    shared_up = gate_up(f"{prefix}.shared_expert", "up_proj")
    renames |= {f"shared.{local}": source for local, source in shared_up.items()}
    return moe, renames
