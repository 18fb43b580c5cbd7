"""What a model costs in memory at its serving dtype: the weights, a token's keys and values,
a Mamba state slot; read from the config alone (a checkpoint's `config.json` and its
safetensors headers, or the built-in model's shape), before any weight is loaded."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import NamedTuple

from engine.config import ModelConfig

BUILT_IN_ARCHITECTURE = "JunctionHybrid"  # the built-in model of random weights
ITEM_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}


class Footprint(NamedTuple):
    architecture: str
    num_attention_layers: int
    num_mamba_layers: int
    attention_bytes_per_token: int  # a key and a value in every attention layer
    mamba_bytes_per_slot: int  # the state of one sequence in every state (Mamba) layer
    weights_bytes: int  # every parameter at the serving dtype
    # what the state group (the cache's `mamba` group) holds: "mamba" (Mamba-2 conv and SSM
    # states) or "linear" (Gated DeltaNet conv states and recurrent matrices)
    state_kind: str = "mamba"


def safetensors_numel(model_dir: Path) -> int:
    """The number of weights in a directory's `*.safetensors` files, from their headers."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def footprint(model: ModelConfig) -> Footprint:
    if model.model_dir is not None:
        from engine.model.hf.config import load_spec

        spec = load_spec(Path(model.model_dir))
        return Footprint(
            spec.architecture,
            spec.num_attention_layers,
            spec.num_mamba_layers,
            spec.attention_bytes_per_token(model.dtype),
            spec.mamba_bytes_per_slot(model.dtype),
            safetensors_numel(Path(model.model_dir)) * ITEM_SIZES[model.dtype],
            spec.state_kind,
        )
    import torch

    from engine.model.hybrid import HybridModel, mamba_shape

    item = ITEM_SIZES[model.dtype]
    num_mamba_layers = model.num_layers - model.num_attention_layers
    head_dim = model.d_model // model.num_heads
    conv, ssm = mamba_shape(model).state_shapes()
    with torch.device("meta"):  # the parameters' shapes, no memory
        num_weights = sum(p.numel() for p in HybridModel(model).parameters())
    return Footprint(
        BUILT_IN_ARCHITECTURE,
        model.num_attention_layers,
        num_mamba_layers,
        2 * model.num_attention_layers * model.num_kv_heads * head_dim * item,
        num_mamba_layers * (math.prod(conv) + math.prod(ssm)) * item,
        num_weights * item,
    )
