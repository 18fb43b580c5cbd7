"""A Hugging Face checkpoint's config.json, read into the geometry Junction sizes its caches by.

Glossary (per Mamba layer):
    h   SSM heads          p   head dim          n   state size
    g   groups of B/C      k   conv width        m   conv channels = h * p + 2 * g * n

One Mamba slot holds, per Mamba layer, conv [m, k - 1] and ssm [h, p, n] (the layout of
`engine.model.mamba2`); one attention token holds, per attention layer, a key and a value of
[K, dh] each.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SUPPORTED = ("BambaForCausalLM", "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM")

#: transformers' layer type names -> Junction's
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
class HFModelSpec:
    """What Junction needs from a checkpoint's config before it loads any weight."""

    model_dir: Path
    architecture: str  # one of SUPPORTED
    vocab_size: int
    hidden_size: int
    # per layer of the checkpoint: "attention" | "mamba" | "mlp" | "moe"; in Bamba and Granite
    # every layer also carries a feed-forward (`ffn_kind`), in Nemotron-H none does
    layer_kinds: tuple[str, ...]
    ffn_kind: str | None  # "mlp" | "moe" | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    mamba: MambaGeometry
    dtype: str  # the checkpoint's own dtype, e.g. "bfloat16"
    hf_config: Any  # the transformers PretrainedConfig, for the family's finer details

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "attention"]

    @property
    def mamba_layer_ids(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "mamba"]

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
    if architecture == "NemotronHForCausalLM":
        mamba = MambaGeometry(
            config.mamba_num_heads,
            config.mamba_head_dim,
            config.ssm_state_size,
            config.n_groups,
            config.conv_kernel,
        )
        names = ("mamba_num_heads", "n_groups")
        ffn_kind = None
    else:
        mamba = MambaGeometry(
            config.mamba_n_heads,
            config.mamba_d_head,
            config.mamba_d_state,
            config.mamba_n_groups,
            config.mamba_d_conv,
        )
        names = ("mamba_n_heads", "mamba_n_groups")
        experts = getattr(config, "num_local_experts", 0) or 0
        ffn_kind = "moe" if architecture == "GraniteMoeHybridForCausalLM" and experts > 0 else "mlp"
    _require_divisible(
        path, "Mamba B/C groups", (names[0], mamba.num_heads), (names[1], mamba.num_groups)
    )

    unknown = sorted(set(config.layer_types) - LAYER_KINDS.keys())
    if unknown:
        raise ValueError(f"{path}: unknown layer types {unknown}")
    return HFModelSpec(
        model_dir=model_dir,
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=hidden,
        layer_kinds=tuple(LAYER_KINDS[t] for t in config.layer_types),
        ffn_kind=ffn_kind,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        mamba=mamba,
        dtype=str(getattr(config, "dtype", None) or "float32").removeprefix("torch."),
        hf_config=config,
    )
