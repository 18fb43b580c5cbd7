"""Building the model a `ModelConfig` names: a Hugging Face checkpoint, or the built-in one."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.model.hf import load_hf_model
from engine.model.hybrid import HybridModel, HybridStack


def resolve_device(config: ModelConfig) -> torch.device:
    if config.device is not None:
        return torch.device(config.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_model(config: ModelConfig) -> HybridStack:
    """A Hugging Face checkpoint from `config.model_dir` if set; else the built-in model from
    `config.weights_path` if set, else from the seed. On the device and dtype, eval."""
    if config.model_dir:
        return load_hf_model(Path(config.model_dir), config.dtype, resolve_device(config))
    if config.weights_path:
        model = HybridModel.load(config, config.weights_path)
    else:
        model = HybridModel(config)
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    return model.to(device=resolve_device(config), dtype=dtype).eval()
