"""Hugging Face-format Mamba-2 hybrid checkpoints on Junction's paged implementation.

`load_spec(dir)` reads config.json alone (the cache's sizes); `load_hf_model(dir)`
builds the model and reads the weights, every check before it returns.
"""

from engine.model.hf.architectures import ARCHITECTURES, SUPPORTED
from engine.model.hf.config import load_spec
from engine.model.hf.loader import load_hf_model
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import MambaStateShape

__all__ = [
    "ARCHITECTURES",
    "SUPPORTED",
    "HFModelSpec",
    "MambaStateShape",
    "load_hf_model",
    "load_spec",
]
