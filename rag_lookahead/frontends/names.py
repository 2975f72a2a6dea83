"""The model's name as every front end shows it (traces, metadata, ``/v1/models``)."""

from __future__ import annotations

from pathlib import Path

from rag_lookahead.interface import Engine
from rag_lookahead.models import DEFAULT_MODEL, builtin_name, default_cache_dir

__all__ = ["display_name"]


def display_name(engine: Engine) -> str:
    """A built-in model converted into the cache is named by its built-in name, any other
    model by its name or path (the default model's name when the engine has none)."""
    name = engine.model_name
    if not name:
        return DEFAULT_MODEL
    if Path(name).parent == default_cache_dir() / "models":
        return builtin_name(name) or name
    return name
