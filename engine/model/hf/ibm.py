"""IBM's Mamba-2 hybrids, Bamba and Granite (4.0), as Junction stacks plus the name maps of
their weights. A checkpoint layer holds a mixer and a feed-forward, so it becomes two blocks:

    Bamba      layer = [mamba | attention (RoPE on half of each head)] + SwiGLU MLP; untied head
    Granite    layer = [mamba | attention (RoPE or none)] + (MoE + shared MLP | shared MLP);
               embedding x embedding_multiplier, both residuals x residual_multiplier,
               attention scores x attention_multiplier, logits / logits_scaling

Junction's scan is exact at any chunk length, so the checkpoint's `chunk_size` (a speed knob
of the reference) is not used; the Mamba layers keep Junction's own.
"""

from __future__ import annotations

from engine.model.hf.builders import Built, NameMap, attention, finish, ibm_mamba
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import MambaStateShape, StateFields
from engine.model.hf.weights import Source
from engine.model.mlp import MLP
from engine.model.moe import MoE

#: Bamba's Mamba layer, which Granite shares
IBM_STATE = StateFields(
    "mamba",
    MambaStateShape,
    ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv"),
    ("mamba_n_heads", "mamba_n_groups"),
    "Mamba B/C groups",
)


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
