"""Hugging Face-format Mamba-2 hybrid checkpoints on Junction's paged implementation.

`load_spec(dir)` reads config.json alone (the cache geometry, for sizing); `load_hf_model(dir)`
builds the model and reads the weights, every check before it returns.
"""

from engine.model.hf.architectures import ARCHITECTURES, SUPPORTED
from engine.model.hf.config import load_spec
from engine.model.hf.geometry import MambaGeometry
from engine.model.hf.loader import load_hf_model
from engine.model.hf.spec import HFModelSpec

__all__ = [
    "ARCHITECTURES",
    "SUPPORTED",
    "HFModelSpec",
    "MambaGeometry",
    "load_hf_model",
    "load_spec",
]
