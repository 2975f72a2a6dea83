"""The engine a `LookaheadLLM` decodes with: one given, a server at a ``base_url``, or a model
loaded offline; and its plain twin for ``lookahead=False``."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from rag_lookahead import DEFAULT_MODEL, LookaheadEngine
from rag_lookahead.interface import Engine
from rag_lookahead.server import ServerEngine

__all__ = ["plain_engine", "resolve_engine", "server_arguments"]

_PLAIN_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


def resolve_engine(
    engine: Engine | None,
    model_name: str | None,
    options: Mapping[str, Any],
    server: Mapping[str, Any] | None = None,
) -> Engine:
    """``engine``; or, with ``server`` (`ServerEngine`'s arguments, ``base_url`` among them),
    the server answering as ``model_name``; or ``model_name`` (default: the embedded model)
    loaded offline with the loading ``options`` of `LookaheadEngine.from_pretrained`.
    ``None`` values count as not given."""
    given = {key: value for key, value in options.items() if value is not None}
    if server is not None and engine is None:
        return _server_engine(model_name, given, server)
    if server is not None:
        raise ValueError("pass either an engine or `base_url`, not both")
    if engine is None:
        path = None if model_name in (None, DEFAULT_MODEL) else model_name
        return LookaheadEngine.from_pretrained(path, **given)
    if given:
        raise ValueError(
            f"pass either an engine or options to load one ({', '.join(sorted(given))}), not both"
        )
    return engine


def server_arguments(base_url: str | None, *, server_kind: str, **settings: Any) -> dict[str, Any] | None:
    """`ServerEngine`'s arguments for a server at ``base_url``; ``None`` without one, where
    ``settings`` other than ``context_window`` (and a ``server_kind`` besides the default)
    are refused: they would go unused."""
    if base_url is not None:
        return {"base_url": base_url, "kind": server_kind, **settings}
    unused = [name for name, value in settings.items() if value is not None and name != "context_window"]
    unused += ["server_kind"] if server_kind != "openai" else []
    if unused:
        raise ValueError(f"{unused} apply to a server: pass `base_url` too")
    return None


def _server_engine(model_name: str | None, local: Mapping[str, Any], server: Mapping[str, Any]) -> Engine:
    if local:
        raise ValueError(f"{sorted(local)} apply to a local model, not to a server at `base_url`")
    if not model_name:
        raise ValueError("with `base_url`, `model` (or `model_name`) is the served model's name")
    arguments = {key: value for key, value in server.items() if value is not None}
    return ServerEngine(arguments.pop("base_url"), model_name, **arguments)


def plain_engine(engine: Engine) -> Engine:
    """An engine that never drafts, over ``engine``'s model, for ``lookahead=False``."""
    plain = _PLAIN_ENGINES.get(engine)
    if plain is None:
        plain = _PLAIN_ENGINES.setdefault(engine, engine.plain())  # shares the model, runner and trie
    return plain
