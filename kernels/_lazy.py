"""Modules imported on first use: optional dependencies (CuPy) and modules that import their importer."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def imported(name: str) -> ModuleType:
    """The module ``name``: from ``sys.modules`` once imported (a dictionary lookup, cheap enough for a
    kernel launch's path), imported on the first call. A module that another thread is still importing is
    in ``sys.modules`` before its body has run: then ``importlib`` waits for that import to finish. An
    import error reaches the caller."""
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return importlib.import_module(name)
    return mod
