"""What Junction needs from a checkpoint's config before it loads any weight: `HFModelSpec`.

`engine.model.hf.config.load_spec` reads it; the cache sizes its pools by its byte counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model.hf.state_shapes import STATE_LAYER_KINDS, GDNStateShape, MambaStateShape

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class HFModelSpec:
    """What Junction needs from a checkpoint's config before it loads any weight."""

    model_dir: Path
    architecture: str  # a name `engine.model.hf.architectures.ARCHITECTURES` lists
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
    mamba: MambaStateShape | GDNStateShape  # the state layers' shape, whichever kind they are
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
        return "linear" if isinstance(self.mamba, GDNStateShape) else "mamba"

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
