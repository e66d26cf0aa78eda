"""Modules imported on first use: optional dependencies (CuPy) and modules that import their importer."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def imported(name: str) -> ModuleType:
    """The module ``name``: from ``sys.modules`` once imported (a dictionary lookup, cheap enough for a
    kernel launch's path), imported on the first call. An import error reaches the caller."""
    mod = sys.modules.get(name)
    return mod if mod is not None else importlib.import_module(name)
