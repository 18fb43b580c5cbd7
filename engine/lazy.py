"""A package's public names imported on first use (PEP 562): `junction route` and `junction
--help` import packages whose names pull in torch or transformers, and must not pay for them.

    __getattr__, __dir__ = lazy_names(__name__, {"load_hf_model": "engine.model.hf.loader"},
                                      __all__)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_names(
    package: str, homes: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's module `__getattr__` (each name in `homes` from the module named there,
    kept in the package's globals so later reads skip it; `AttributeError` for any other name)
    and its `__dir__`."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return __getattr__, __dir__
