"""What a client may know of the engine: the schema that crosses the wire, named here in one
list. The dashboard imports these from here, never from `engine` itself (the layering test
holds it to that)."""

from __future__ import annotations

from engine.geometry import CacheGeometry
from engine.model.tokenizer import ByteTokenizer
from engine.modes import MODES, RUNNER_NAMES

__all__ = ["MODES", "RUNNER_NAMES", "ByteTokenizer", "CacheGeometry"]
