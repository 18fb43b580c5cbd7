"""Hugging Face-format Mamba-2 hybrid checkpoints on Junction's paged implementation.

`load_spec(dir)` reads config.json alone (the cache's sizes); `load_hf_model(dir)`
builds the model and reads the weights, every check before it returns.

The names below load with their module on first use (PEP 562), not with the package: a
command that needs only `engine.model.hf.tokenizer` (the router's byte tokenizer) must not
pay for torch and safetensors, which the builders and the weights import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

if TYPE_CHECKING:
    from engine.model.hf.architectures import ARCHITECTURES, SUPPORTED
    from engine.model.hf.config import load_spec
    from engine.model.hf.loader import load_hf_model
    from engine.model.hf.spec import HFModelSpec
    from engine.model.hf.state_shapes import MambaStateShape

#: each public name, and the module that defines it
_HOMES = {
    "ARCHITECTURES": "engine.model.hf.architectures",
    "SUPPORTED": "engine.model.hf.architectures",
    "HFModelSpec": "engine.model.hf.spec",
    "MambaStateShape": "engine.model.hf.state_shapes",
    "load_hf_model": "engine.model.hf.loader",
    "load_spec": "engine.model.hf.config",
}

__all__ = [
    "ARCHITECTURES",
    "SUPPORTED",
    "HFModelSpec",
    "MambaStateShape",
    "load_hf_model",
    "load_spec",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
