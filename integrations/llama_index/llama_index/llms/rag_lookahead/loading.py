"""The engine a `LookaheadLLM` decodes with: one given, or a model loaded offline; and its
plain twin for ``lookahead=False``."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from rag_lookahead import DEFAULT_MODEL, LookaheadEngine
from rag_lookahead.interface import Engine

__all__ = ["plain_engine", "resolve_engine"]

_PLAIN_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


def resolve_engine(engine: Engine | None, model_name: str | None, options: Mapping[str, Any]) -> Engine:
    """``engine``, or ``model_name`` (default: the embedded model) loaded offline with the
    loading ``options`` of `LookaheadEngine.from_pretrained` (``None`` values are not given)."""
    given = {key: value for key, value in options.items() if value is not None}
    if engine is None:
        path = None if model_name in (None, DEFAULT_MODEL) else model_name
        return LookaheadEngine.from_pretrained(path, **given)
    if given:
        raise ValueError(
            f"pass either an engine or options to load one ({', '.join(sorted(given))}), not both"
        )
    return engine


def plain_engine(engine: Engine) -> Engine:
    """An engine that never drafts, over ``engine``'s model, for ``lookahead=False``."""
    plain = _PLAIN_ENGINES.get(engine)
    if plain is None:
        plain = _PLAIN_ENGINES.setdefault(engine, engine.plain())  # shares the model, runner and trie
    return plain
