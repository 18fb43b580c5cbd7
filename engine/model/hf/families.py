"""The three checkpoint families, each as a Junction stack plus the name map of its weights.

Every family becomes a `HybridStack` of pre-norm residual blocks. A checkpoint layer that holds
a mixer and a feed-forward (Bamba, Granite) becomes two blocks; a Nemotron-H layer, which holds
one of the four, becomes one:

    Bamba      layer = [mamba | attention (RoPE on half of each head)] + SwiGLU MLP; untied head
    Granite    layer = [mamba | attention (RoPE or none)] + (MoE + shared MLP | shared MLP);
               embedding x embedding_multiplier, both residuals x residual_multiplier,
               attention scores x attention_multiplier, logits / logits_scaling
    Nemotron-H pattern over M (mamba) * (attention, no RoPE) - (ReLU^2 MLP) E (MoE: sigmoid
               router with a score bias, ReLU^2 experts, shared expert); gated norm per group

Junction's scan is exact at any chunk length, so the checkpoint's `chunk_size` (a speed knob
of the reference) is not used; the Mamba layers keep Junction's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from engine.model.attention import Attention
from engine.model.hf.config import DTYPES, HFModelSpec, load_spec
from engine.model.hf.weights import Source, load_weights
from engine.model.hybrid import Block, HybridStack
from engine.model.mamba2 import Mamba2Mixer, MambaShape
from engine.model.mlp import MLP
from engine.model.moe import MoE


class NameMap:
    """The blocks of a stack being built and, for each parameter, its checkpoint source."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.blocks: list[Block] = []
        self.sources: dict[str, Source] = {}

    def add(
        self,
        mixer: nn.Module,
        norm: str,
        prefix: str,
        *,
        eps: float,
        residual_scale: float = 1.0,
        renames: dict[str, str | Source] | None = None,
    ) -> None:
        """A block whose norm is stored at `norm` and whose mixer's parameters under `prefix`,
        by the same local names except those in `renames` (a local name, or a full source)."""
        index = len(self.blocks)
        block = Block(mixer, self.d, eps, residual_scale)
        self.blocks.append(block)
        self.sources[f"layers.{index}.norm.weight"] = Source((norm,))
        renames = renames or {}
        for local, _ in mixer.named_parameters():
            rename = renames.get(local, local)
            source = rename if isinstance(rename, Source) else Source((f"{prefix}.{rename}",))
            self.sources[f"layers.{index}.mixer.{local}"] = source


def require(condition: bool, spec: HFModelSpec, message: str) -> None:
    if not condition:
        raise ValueError(f"{spec.model_dir / 'config.json'}: {message}")


# ---------------------------------------------------------------- shared layer builders


def attention(
    spec: HFModelSpec, *, rope: bool, bias: bool, scale: float | None = None
) -> Attention:
    c = spec.hf_config
    theta, rotary_dim = None, None
    if rope:
        parameters = c.rope_parameters or {}
        rope_type = parameters.get("rope_type", "default")
        require(rope_type == "default", spec, f"RoPE type {rope_type!r} is not supported")
        theta = float(parameters.get("rope_theta", 10000.0))
        rotary_dim = int(spec.head_dim * parameters.get("partial_rotary_factor", 1.0))
    return Attention(
        spec.hidden_size,
        spec.num_attention_heads,
        spec.num_kv_heads,
        theta,
        head_dim=spec.head_dim,
        bias=bias,
        scale=scale,
        rotary_dim=rotary_dim,
    )


def mamba_shape(spec: HFModelSpec) -> MambaShape:
    g = spec.mamba
    return MambaShape(
        spec.hidden_size,
        headdim=g.head_dim,
        d_state=g.state_size,
        ngroups=g.num_groups,
        d_conv=g.conv_kernel,
        nheads=g.num_heads,
    )


def mamba(
    spec: HFModelSpec,
    prefix: str,
    *,
    act: str,
    bias: bool,
    conv_bias: bool,
    eps: float,
    norm_groups: int,
    dt_limit: tuple[float, float] | None,
) -> tuple[Mamba2Mixer, dict[str, str | Source]]:
    """The mixer and the renames of its conv (stored as a Conv1d, weight [m, 1, k])."""
    require(act == "silu", spec, f"Mamba activation {act!r} is not supported (only silu)")
    shape = mamba_shape(spec)
    mixer = Mamba2Mixer(
        shape,
        bias=bias,
        conv_bias=conv_bias,
        norm_eps=eps,
        norm_groups=norm_groups,
        dt_limit=tuple(dt_limit) if dt_limit is not None else (0.0, float("inf")),
    )
    conv = Source((f"{prefix}.conv1d.weight",), shape=(shape.m, 1, shape.d_conv))
    return mixer, {"conv_weight": conv, "conv_bias": "conv1d.bias"}


def ibm_mamba(spec: HFModelSpec, prefix: str) -> tuple[Mamba2Mixer, dict[str, str | Source]]:
    """Bamba's Mamba layer, which Granite shares: the gated norm over the whole inner width."""
    c = spec.hf_config
    return mamba(
        spec,
        prefix,
        act=c.hidden_act,
        bias=c.mamba_proj_bias,
        conv_bias=c.mamba_conv_bias,
        eps=c.rms_norm_eps,
        norm_groups=1,
        dt_limit=c.time_step_limit,
    )


def finish(
    spec: HFModelSpec, names: NameMap, embedding: str, final_norm: str, **scales: float
) -> tuple[HybridStack, dict[str, Source], list[str]]:
    """The stack around `names`' blocks; the head is `lm_head` unless the config ties it."""
    c = spec.hf_config
    tied = bool(c.tie_word_embeddings)
    eps = getattr(c, "rms_norm_eps", None) or c.layer_norm_epsilon
    model = HybridStack(
        spec.vocab_size,
        spec.hidden_size,
        names.blocks,
        mamba_shape(spec),
        eps=eps,
        tied=tied,
        **scales,
    )
    sources = dict(names.sources)
    sources["embedding.weight"] = Source((embedding,))
    sources["final_norm.weight"] = Source((final_norm,))
    if not tied:
        sources["lm_head.weight"] = Source(("lm_head.weight",))
    ignored = [r"^lm_head\.weight$"] if tied else []
    return model, sources, ignored


# ---------------------------------------------------------------- the families

Built = tuple[HybridStack, dict[str, Source], list[str]]  # model, name map, ignored tensors


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
