"""Loading a checkpoint: its spec, its architecture's builder, then every weight, checked."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.model.hf.architectures import ARCHITECTURES
from engine.model.hf.config import load_spec
from engine.model.hf.spec import DTYPES
from engine.model.hf.weights import load_weights
from engine.model.hybrid import HybridStack

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
        model, sources, ignored = ARCHITECTURES[spec.architecture].build(spec)
    model = model.to(DTYPES[dtype]).to_empty(device=device or "cpu")
    load_weights(model, sources, model_dir, ignored + IGNORED)
    model.spec = spec
    return model.eval()
