"""Hugging Face-format Mamba-2 hybrid checkpoints on Junction's paged implementation.

`load_spec(dir)` reads config.json alone (the cache geometry, for sizing); `load_hf_model(dir)`
builds the model and reads the weights, every check before it returns.
"""

from engine.model.hf.config import SUPPORTED, HFModelSpec, MambaGeometry, load_spec
from engine.model.hf.families import load_hf_model

__all__ = ["SUPPORTED", "HFModelSpec", "MambaGeometry", "load_hf_model", "load_spec"]
