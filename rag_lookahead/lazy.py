"""Package attributes imported when first asked for (PEP 562), so that importing a package does
not import torch: the command line parses its arguments, and answers ``--help``, before any
model code loads. Each package lists its names under ``TYPE_CHECKING`` too, for type checkers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``exports`` comes from the module
    it maps to, imported on first use and then kept in the package like an eager import."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
