"""What every family's builder shares: the name map of a stack being built, the config checks,
and the layers more than one family makes (attention, the Mamba-2 mixer, the state shape, the
stack around the blocks).

A family maps every parameter of the Junction model to a `Source` (engine.model.hf.weights);
`NameMap.add` records a block's sources as it appends the block.
"""

from __future__ import annotations

from torch import nn

from engine.model.attention import Attention
from engine.model.gdn import GDNShape
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import GDNStateShape
from engine.model.hf.weights import Source
from engine.model.hybrid import Block, HybridStack
from engine.model.mamba2 import Mamba2Mixer, MambaShape

Built = tuple[HybridStack, dict[str, Source], list[str]]  # model, name map, ignored tensors


class NameMap:
    """The blocks of a stack being built and, for each parameter, its checkpoint source."""

    def __init__(self, d: int, norm_offset: float = 0.0) -> None:
        self.d = d
        self.norm_offset = norm_offset  # every block norm's (Qwen: 1)
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
        block = Block(mixer, self.d, eps, residual_scale, self.norm_offset)
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


def attention(
    spec: HFModelSpec, *, rope: bool, bias: bool, scale: float | None = None, **gating
) -> Attention:
    """`gating`: Attention's `output_gate` and `qk_norm`, for the families that have them."""
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
        **gating,
    )


def mamba_shape(spec: HFModelSpec) -> MambaShape | GDNShape:
    """The state layers' shape, whichever kind they are."""
    g = spec.mamba
    if isinstance(g, GDNStateShape):
        return GDNShape(
            spec.hidden_size,
            g.num_k_heads,
            g.num_v_heads,
            g.head_k_dim,
            g.head_v_dim,
            conv_kernel=g.conv_kernel,
        )
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
    tied = spec.tie_word_embeddings
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
    return model, sources, ignored + list(spec.ignored)


def gate_up(prefix: str, local: str) -> dict[str, str | Source]:
    """A gated MLP's `local` weight: the checkpoint's gate_proj and up_proj, joined."""
    names = (f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight")
    return {f"{local}.weight": Source(names, "cat")}
