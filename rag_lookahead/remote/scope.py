"""Documents of one query on a server, for the calls given the scope, until it is closed."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from rag_lookahead.engine.scope import ScopeLifecycle, document_texts
from rag_lookahead.remote.corpus import CorpusClient

__all__ = ["ServerScope"]


class ServerScope(ScopeLifecycle):
    """On SGLang, each `add` loads the documents as an external corpus of the server; on a
    rag-lookahead server, the first `add` loads a corpus and later ones add to it (the scope's
    calls name it). `close` removes every corpus the scope loaded. Elsewhere the scope only
    holds the texts, which the calls given it must already show in their prompts (or append,
    if so configured).
    """

    def __init__(self, owner: object, corpus: CorpusClient | None) -> None:
        self.owner = owner  # the engine that opened it
        self.key = owner  # its `scope_key`: calls of other engines refuse it
        self._corpus = corpus
        self._documents: list[str] = []
        self._corpus_ids: list[str] = []
        self._closed = False
        self._lock = threading.Lock()

    @property
    def documents(self) -> tuple[str, ...]:
        return tuple(self._documents)

    @property
    def corpus_ids(self) -> tuple[str, ...]:
        """The server corpora this scope loaded and has not removed yet."""
        return tuple(self._corpus_ids)

    def add(self, documents: Iterable[str]) -> None:
        texts = [text for text in document_texts(documents) if text]
        with self._lock:
            if self._closed:
                raise RuntimeError("this document scope is closed; open a new one")
            if texts and self._corpus is not None:
                if self._corpus_ids and self._corpus.extendable:
                    self._corpus.extend(self._corpus_ids[0], texts)
                else:
                    self._corpus_ids.append(self._corpus.add(texts))
            self._documents.extend(texts)

    def reload(self) -> None:
        """Load the scope's documents again as one new corpus, after the server dropped the
        scope's (a rag-lookahead corpus left unused past its TTL)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this document scope is closed; open a new one")
            if self._corpus is not None and self._documents:
                self._corpus_ids = [self._corpus.add(self._documents)]

    def close(self) -> None:
        """Remove every corpus this scope loaded (idempotent). Each removal is tried even when
        an earlier one fails; the first failure is raised afterwards, and the corpora that
        failed are retried when the engine's next call or scope ends."""
        failure = self._remove()
        if failure is not None:
            raise failure

    def _remove(self) -> Exception | None:
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            ids, self._corpus_ids = self._corpus_ids, []
        if self._corpus is None:
            return None
        return self._corpus.remove_all(ids)

    def __exit__(self, *exc: object) -> None:
        # A warning, not an error: the block's answer (or its own error) is what the caller
        # wants, and the failed removals are retried later.
        failure = self._remove()
        if failure is not None and self._corpus is not None:
            self._corpus.warn(failure, "a document scope")
