"""Corpora: documents that several requests draft from, named by an id, alive until deleted or
left unused past a TTL.

A corpus is one scope of the engine (`Engine.scope`): its documents enter the trie once, owned
by the scope, and leave it when the corpus goes. A call naming a corpus holds a lease on it, so
that a corpus deleted or expiring while calls use it stays until the last of them has ended.
The registry is bounded (`ServeSettings.max_corpora` and ``max_corpus_bytes``). Its methods may
block (tokenizing, updating the trie), so the server runs them in worker threads; one lock
guards the bookkeeping, never the trie work.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rag_lookahead.interface import Engine
from rag_lookahead.serve.errors import ApiError
from rag_lookahead.serve.metrics import ServerMetrics
from rag_lookahead.serve.settings import ServeSettings

__all__ = ["Corpora", "CorpusLease"]


@dataclass
class _Corpus:
    """One corpus's bookkeeping (read and written under the registry's lock)."""

    id: str
    scope: Any  # the engine's scope holding the documents' branches
    created: int
    ttl_s: float
    last_used: float
    documents: int = 0
    bytes: int = 0
    users: int = 0  # calls (and additions) running with it now
    gone: bool = False  # deleted or expired: no new user; closed once the last one ends

    def describe(self, now: float) -> dict[str, Any]:
        idle = now - self.last_used
        return {
            "id": self.id,
            "object": "corpus",
            "created": self.created,
            "documents": self.documents,
            "bytes": self.bytes,
            "ttl_seconds": self.ttl_s,
            "in_use": self.users,
            # While calls use it, it cannot expire.
            "expires_in_seconds": None if self.users else max(0.0, self.ttl_s - idle),
        }


class CorpusLease:
    """A call's hold on a corpus; `release` (idempotent) lets it expire or go once unused."""

    def __init__(self, corpora: Corpora, corpus: _Corpus) -> None:
        self._corpora = corpora
        self._corpus = corpus
        self._held = True

    @property
    def scope(self) -> Any:
        """The engine scope a call drafts from (pass it as ``scope=``)."""
        return self._corpus.scope

    def release(self) -> None:
        if self._held:
            self._held = False
            self._corpora._release(self._corpus)


class Corpora:
    """The server's live corpora, bounded in number and bytes."""

    def __init__(
        self,
        engine: Engine,
        settings: ServeSettings,
        metrics: ServerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._ttl_s = settings.corpus_ttl_s
        self._max_count = settings.max_corpora
        self._max_bytes = settings.max_corpus_bytes
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, _Corpus] = {}
        self._pending = 0  # corpora being created: counted against the bound already
        self._bytes = 0  # held by live, pending and gone-but-in-use corpora

    @property
    def ttl_s(self) -> float:
        """The longest a corpus lives unused (a request may ask for less)."""
        return self._ttl_s

    @property
    def count(self) -> int:
        """Live corpora (created and neither deleted nor expired)."""
        return len(self._live)

    def create(self, documents: Sequence[str], ttl_s: float | None = None) -> dict[str, Any]:
        """A new corpus of ``documents`` (their branches enter the trie now); its description."""
        texts = [text for text in documents if text]
        size = _size(texts)
        self.sweep()
        with self._lock:
            self._check_room(size, len(self._live) + self._pending + 1)
            self._pending += 1
            self._bytes += size
        try:
            scope = self._engine.scope(texts)
        except BaseException:
            with self._lock:
                self._pending -= 1
                self._bytes -= size
            raise
        now = self._clock()
        corpus = _Corpus(
            id=f"corpus-{uuid.uuid4().hex}",  # unguessable: an id is what lets a client use it
            scope=scope,
            created=int(time.time()),
            ttl_s=self._ttl_s if ttl_s is None else ttl_s,
            last_used=now,
            documents=len(texts),
            bytes=size,
        )
        with self._lock:
            self._pending -= 1
            self._live[corpus.id] = corpus
            self._gauge()
            return corpus.describe(now)

    def extend(self, corpus_id: str, documents: Sequence[str]) -> dict[str, Any]:
        """Add ``documents`` to a live corpus; its new description."""
        texts = [text for text in documents if text]
        size = _size(texts)
        self.sweep()
        with self._lock:
            corpus = self._find(corpus_id, None)
            if corpus.bytes + size > self._max_bytes:
                raise _too_large(corpus.bytes + size, self._max_bytes)
            self._check_room(size, len(self._live) + self._pending)
            self._bytes += size
            corpus.users += 1  # not closed (deleted, expired) while its documents go in
        try:
            corpus.scope.add(texts)
        except BaseException:
            with self._lock:
                self._bytes -= size
            self._release(corpus)
            raise
        with self._lock:
            corpus.documents += len(texts)
            corpus.bytes += size
        self._release(corpus)
        with self._lock:
            return corpus.describe(self._clock())

    def describe(self, corpus_id: str) -> dict[str, Any]:
        self.sweep()
        with self._lock:
            return self._find(corpus_id, None).describe(self._clock())

    def delete(self, corpus_id: str) -> dict[str, Any]:
        """Remove a corpus: now, or when the last call using it ends."""
        self.sweep()
        with self._lock:
            corpus = self._find(corpus_id, None)
            self._retire(corpus)
            unused = corpus.users == 0
        if unused:
            self._close(corpus)
        return {"id": corpus_id, "object": "corpus.deleted", "deleted": True}

    def lease(self, corpus_id: str) -> CorpusLease:
        """A call's hold on a live corpus (404 naming the request's ``corpus`` if none)."""
        self.sweep()
        with self._lock:
            corpus = self._find(corpus_id, "corpus")
            corpus.users += 1
        return CorpusLease(self, corpus)

    def sweep(self) -> int:
        """Remove the corpora left unused past their TTL; returns how many."""
        now = self._clock()
        with self._lock:
            expired = [c for c in self._live.values() if not c.users and now - c.last_used >= c.ttl_s]
            for corpus in expired:
                self._retire(corpus)
        for corpus in expired:
            self._close(corpus)
        return len(expired)

    def close(self) -> None:
        """Remove every corpus (those in use when their last call ends)."""
        with self._lock:
            corpora = list(self._live.values())
            for corpus in corpora:
                self._retire(corpus)
            unused = [c for c in corpora if not c.users]
        for corpus in unused:
            self._close(corpus)

    # ------------------------------------------------------------------ helpers

    def _find(self, corpus_id: str, param: str | None) -> _Corpus:
        corpus = self._live.get(corpus_id)
        if corpus is None:
            raise ApiError(
                404,
                f"no corpus {corpus_id!r}: it was deleted, left unused past its TTL, or never created",
                code="corpus_not_found",
                param=param,
            )
        return corpus

    def _check_room(self, size: int, count: int) -> None:
        if size > self._max_bytes:
            raise _too_large(size, self._max_bytes)
        if count > self._max_count:
            raise ApiError(
                429,
                f"too many corpora: this server keeps at most {self._max_count}; delete those "
                "you no longer need (unused ones expire)",
                code="too_many_corpora",
            )
        if self._bytes + size > self._max_bytes:
            raise ApiError(
                429,
                f"the corpora would hold more than {self._max_bytes} bytes: delete those you "
                "no longer need (unused ones expire), or send fewer documents",
                code="corpus_storage_full",
            )

    def _retire(self, corpus: _Corpus) -> None:
        """Take a live corpus out of the table (under the lock): no new call may use it."""
        del self._live[corpus.id]
        corpus.gone = True
        self._gauge()

    def _release(self, corpus: _Corpus) -> None:
        with self._lock:
            corpus.users -= 1
            corpus.last_used = self._clock()
            closing = corpus.gone and not corpus.users
        if closing:
            self._close(corpus)

    def _close(self, corpus: _Corpus) -> None:
        """Eliminate a gone, unused corpus's branches from the trie."""
        try:
            corpus.scope.close()
        finally:
            with self._lock:
                self._bytes -= corpus.bytes
                self._gauge()

    def _gauge(self) -> None:
        self._metrics.corpora.set(len(self._live))
        self._metrics.corpus_bytes.set(self._bytes)


def _size(texts: Sequence[str]) -> int:
    return sum(len(text.encode("utf-8")) for text in texts)


def _too_large(size: int, most: int) -> ApiError:
    return ApiError(
        413,
        f"the corpus would hold {size} bytes of documents; this server keeps at most {most} in all",
        code="corpus_too_large",
        param="documents",
    )
