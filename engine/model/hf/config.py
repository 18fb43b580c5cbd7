"""A Hugging Face checkpoint's config.json, read into the geometry Junction sizes its caches by.

Glossary (per Mamba-2 layer):
    h   SSM heads          p   head dim          n   state size
    g   groups of B/C      k   conv width        m   conv channels = h * p + 2 * g * n
(per Gated DeltaNet layer, Qwen3.5 / Qwen3-Next):
    Hk  key heads          dk  key head dim      Hv  value heads     dv  value head dim
    k   conv width         m   conv channels = 2 * Hk * dk + Hv * dv

One state slot holds, per state layer, conv [m, k - 1] and ssm [h, p, n] (the layout of
`engine.model.mamba2`), or conv [m, k - 1] and the recurrent matrix [Hv, dk, dv]
(`engine.model.gdn`); one attention token holds, per attention layer, a key and a value of
[K, dh] each. The cache keeps either state as its `mamba` group; the spec names the group by
what it holds (`state_kind`: "mamba" or "linear").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

MAMBA_ARCHITECTURES = ("BambaForCausalLM", "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM")
#: Qwen3.5 as published (image-text-to-text): Junction serves its language model, text only
QWEN_MULTIMODAL = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
QWEN_ARCHITECTURES = (
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3NextForCausalLM",
    *QWEN_MULTIMODAL,
)
SUPPORTED = MAMBA_ARCHITECTURES + QWEN_ARCHITECTURES

#: transformers' layer type names -> Junction's; "mamba" and "linear" layers hold a state slot.
#: Nemotron-H names its Mamba-2 layers linear_attention too; in Qwen they are Gated DeltaNet.
LAYER_KINDS = {
    "full_attention": "attention",
    "attention": "attention",
    "linear_attention": "mamba",
    "mamba": "mamba",
    "mlp": "mlp",
    "moe": "moe",
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class MambaGeometry:
    """The state of one Mamba layer (every Mamba layer of a model has the same one)."""

    num_heads: int  # h
    head_dim: int  # p
    state_size: int  # n
    num_groups: int  # g
    conv_kernel: int  # k

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.inner_size + 2 * self.num_groups * self.state_size

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_channels, self.conv_kernel - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.state_size)


@dataclass(frozen=True)
class GDNGeometry:
    """The state of one Gated DeltaNet layer: conv [m, k - 1] and recurrent [Hv, dk, dv]."""

    num_k_heads: int  # Hk
    num_v_heads: int  # Hv
    head_k_dim: int  # dk
    head_v_dim: int  # dv
    conv_kernel: int  # k

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_channels, self.conv_kernel - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)


STATE_LAYER_KINDS = ("mamba", "linear")


class StateFields(NamedTuple):
    """Where a family's config.json keeps its state layers' geometry."""

    geometry: type  # MambaGeometry or GDNGeometry
    fields: tuple[str, ...]  # the geometry's fields, in order
    divides: tuple[str, str]  # (dividend, divisor): the first must be a multiple of the second
    what: str  # what the division is, for the error


STATE_FIELDS = {
    "ibm": StateFields(  # Bamba, and Granite, which shares Bamba's Mamba layer
        MambaGeometry,
        ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv"),
        ("mamba_n_heads", "mamba_n_groups"),
        "Mamba B/C groups",
    ),
    "nemotron_h": StateFields(
        MambaGeometry,
        ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel"),
        ("mamba_num_heads", "n_groups"),
        "Mamba B/C groups",
    ),
    "qwen": StateFields(
        GDNGeometry,
        (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ),
        ("linear_num_value_heads", "linear_num_key_heads"),
        "Gated DeltaNet key heads shared by value heads",
    ),
}
STATE_FAMILY = {
    "BambaForCausalLM": "ibm",
    "GraniteMoeHybridForCausalLM": "ibm",
    "NemotronHForCausalLM": "nemotron_h",
    **dict.fromkeys(QWEN_ARCHITECTURES, "qwen"),
}


@dataclass(frozen=True)
class HFModelSpec:
    """What Junction needs from a checkpoint's config before it loads any weight."""

    model_dir: Path
    architecture: str  # one of SUPPORTED
    vocab_size: int
    hidden_size: int
    # per layer of the checkpoint: "attention" | "mamba" | "linear" | "mlp" | "moe"; in Bamba,
    # Granite and Qwen every layer also carries a feed-forward (`ffn_kind`; Qwen3-Next mixes
    # MLP and MoE layers, its family reads which from the config), in Nemotron-H none does
    layer_kinds: tuple[str, ...]
    ffn_kind: str | None  # "mlp" | "moe" | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    mamba: MambaGeometry | GDNGeometry  # the state layers' geometry, whichever kind they are
    dtype: str  # the checkpoint's own dtype, e.g. "bfloat16"
    hf_config: Any  # the transformers PretrainedConfig (a multimodal one's text_config)
    # where the language model's weights are stored, and stored tensors it does not read (a
    # multimodal checkpoint's vision tower)
    weights_prefix: str = "model"
    ignored: tuple[str, ...] = ()
    tie_word_embeddings: bool = False

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "attention"]

    @property
    def mamba_layer_ids(self) -> list[int]:
        """The layers that hold a state slot (Mamba-2 or Gated DeltaNet)."""
        return [i for i, kind in enumerate(self.layer_kinds) if kind in STATE_LAYER_KINDS]

    @property
    def state_kind(self) -> str:
        """What the state group holds: "mamba" (Mamba-2) or "linear" (Gated DeltaNet)."""
        return "linear" if isinstance(self.mamba, GDNGeometry) else "mamba"

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layer_ids)

    @property
    def num_mamba_layers(self) -> int:
        return len(self.mamba_layer_ids)

    def attention_bytes_per_token(self, dtype: str | torch.dtype) -> int:
        """Key and value of one token over every attention layer."""
        item = _itemsize(dtype)
        return 2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * item

    def mamba_bytes_per_slot(self, dtype: str | torch.dtype) -> int:
        """Conv and SSM state of one sequence over every Mamba layer."""
        per_layer = math.prod(self.mamba.conv_state_shape) + math.prod(self.mamba.ssm_state_shape)
        return self.num_mamba_layers * per_layer * _itemsize(dtype)


def _itemsize(dtype: str | torch.dtype) -> int:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    return torch.empty((), dtype=dtype).element_size()


def read_architecture(model_dir: Path) -> str:
    """`architectures[0]` of config.json; a ValueError unless Junction supports it."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json: pass a Hugging Face model directory")
    architectures = json.loads(path.read_text()).get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture not in SUPPORTED:
        raise ValueError(
            f"{path}: architecture {architecture!r} is not supported; "
            f"supported architectures: {', '.join(SUPPORTED)}"
        )
    return architecture


def _require_divisible(
    path: Path, what: str, dividend: tuple[str, int], divisor: tuple[str, int]
) -> None:
    """(name, value) pairs as config.json names them; a ValueError unless divisor | dividend."""
    (dividend_name, a), (divisor_name, b) = dividend, divisor
    if a <= 0 or b <= 0 or a % b:
        raise ValueError(
            f"{path}: {what}: {dividend_name} {a} is not divisible by {divisor_name} {b}"
        )


def load_spec(model_dir: Path) -> HFModelSpec:
    """Read and check `model_dir/config.json`. Loads no weights."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    architecture = read_architecture(model_dir)
    path = model_dir / "config.json"
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as error:  # transformers' own checks of the config, with the file named
        raise ValueError(f"{path}: {error}") from error
    tied = bool(getattr(config, "tie_word_embeddings", False))
    prefix, ignored = "model", ()
    if architecture in QWEN_MULTIMODAL:  # the language model, text only
        config = config.text_config
        prefix, ignored = "model.language_model", (r"^model\.visual\.",)

    hidden = config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None)
    if not head_dim:
        what = "attention head size"
        _require_divisible(path, what, ("hidden_size", hidden), ("num_attention_heads", heads))
        head_dim = hidden // heads
    what = "grouped KV heads"
    _require_divisible(
        path, what, ("num_attention_heads", heads), ("num_key_value_heads", kv_heads)
    )

    # transformers has checked that the Mamba heads tile the inner width; not the groups
    family = STATE_FIELDS[STATE_FAMILY[architecture]]
    mamba = family.geometry(*(getattr(config, name) for name in family.fields))
    (dividend, divisor), what = family.divides, family.what
    _require_divisible(
        path, what, (dividend, getattr(config, dividend)), (divisor, getattr(config, divisor))
    )
    experts = getattr(config, "num_experts", 0) or getattr(config, "num_local_experts", 0) or 0
    if architecture == "NemotronHForCausalLM":
        ffn_kind = None  # its feed-forwards are layers of their own
    elif architecture in QWEN_ARCHITECTURES or architecture == "GraniteMoeHybridForCausalLM":
        ffn_kind = "moe" if experts > 0 else "mlp"
    else:
        ffn_kind = "mlp"

    unknown = sorted(set(config.layer_types) - LAYER_KINDS.keys())
    if unknown:
        raise ValueError(f"{path}: unknown layer types {unknown}")
    return HFModelSpec(
        model_dir=model_dir,
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=hidden,
        layer_kinds=tuple(
            "linear" if kind == "mamba" and architecture in QWEN_ARCHITECTURES else kind
            for kind in (LAYER_KINDS[t] for t in config.layer_types)
        ),
        ffn_kind=ffn_kind,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        mamba=mamba,
        dtype=str(getattr(config, "dtype", None) or "float32").removeprefix("torch."),
        hf_config=config,
        weights_prefix=prefix,
        ignored=ignored,
        tie_word_embeddings=tied,
    )
