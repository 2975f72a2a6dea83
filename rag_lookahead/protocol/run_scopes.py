"""The documents and scopes of one run (a chain run, a query, an agent's turn), kept one way by
every front end.

A run's retrieved documents are kept once each, in the order they came, and reach the calls of
its engines through one scope per trie: two variants of one engine (``with_config``, its plain
twin) share a trie, and so a scope, and the run's documents are inserted into it once. Later
retrievals are added to the scopes already open; all of them close when the run ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
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
    """One run's documents, and its scopes, one per `scope_key` of the engines its calls
    decode with."""

    def __init__(self) -> None:
        self._documents: list[str] = []
        self._seen: set[str] = set()
        # Adding documents never waits for an insertion (a tracker adds them under its own lock).
        self._documents_lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.Lock()  # one insertion at a time: no document is inserted twice

    @property
    def documents(self) -> list[str]:
        """The run's documents so far, in the order they came."""
        with self._documents_lock:
            return list(self._documents)

    def add(self, documents: Iterable[str]) -> None:
        """Documents retrieved in the run; empty ones and those it holds already are skipped.
        Nothing is inserted until a call asks for its `scope`."""
        with self._documents_lock:
            for text in documents:
                if text and text not in self._seen:
                    self._seen.add(text)
                    self._documents.append(text)

    def scope(self, engine: Engine) -> Scope:
        """``engine``'s scope of this run, opened on first use, holding the run's documents so
        far (only those not in it yet are inserted)."""
        key = scope_key(engine)
        with self._lock:
            documents = self.documents
            entry = self._entries.get(id(key))
            if entry is None:
                entry = self._entries[id(key)] = _Entry(key, engine.scope())
            entry.scope.add(documents[entry.added :])
            entry.added = len(documents)
            return entry.scope

    def close(self) -> None:
        """Close every scope of the run (the run has ended)."""
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:  # outside the lock: closing waits for the engine
            entry.scope.close()
