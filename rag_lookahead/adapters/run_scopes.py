"""The scopes of one run (a chain run, a query, an agent's turn), kept one way by every front end.

A run's retrieved documents reach the calls of its engines through one scope per trie: two
variants of one engine (``with_config``, its plain twin) share a trie, and so a scope, and the
run's documents are inserted into it once. Later retrievals are added to the scopes already
open; all of them close when the run ends.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag_lookahead.interface import Engine, Scope, scope_key

__all__ = ["RunScopes"]


@dataclass
class _Entry:
    key: Any  # held so that its id stays the key while the entry lives
    scope: Scope
    added: int = 0  # how many of the run's documents are already in the scope


class RunScopes:
    """One run's scopes, one per `scope_key` of the engines its calls decode with."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.Lock()  # one insertion at a time: no document is inserted twice

    def scope(self, engine: Engine, documents: Sequence[str]) -> Scope:
        """``engine``'s scope of this run, opened on first use, holding ``documents`` (the
        run's documents so far, in the order they came: only the new ones are added)."""
        key = scope_key(engine)
        with self._lock:
            entry = self._entries.get(id(key))
            if entry is None:
                entry = self._entries[id(key)] = _Entry(key, engine.scope())
            entry.scope.add(documents[entry.added :])
            entry.added = max(entry.added, len(documents))
            return entry.scope

    def close(self) -> None:
        """Close every scope of the run (the run has ended)."""
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:  # outside the lock: closing waits for the engine
            entry.scope.close()
