"""Corpora on a server: documents its drafter draws from, loaded at run time and removed after.

`CorpusClient` keeps what both servers share (removal retried when it fails, the warning); one
subclass a server:

- `SGLangCorpora`: SGLang (``--speculative-algorithm NGRAM`` with an external SAM budget) serves
  three endpoints beside its OpenAI API: ``POST /add_external_corpus`` with ``{"corpus_id",
  "documents"}``, ``POST /remove_external_corpus`` with ``{"corpus_id"}``, and ``GET
  /list_external_corpora``. Each answers ``{"success": ..., "message": ...}`` (400 on failure).
  A corpus is server-wide: every request on the server may draft from it while it is loaded.
- `LookaheadCorpora`: ``rag-lookahead serve --backend local`` serves ``POST /v1/corpora``
  (documents in, an id out), ``POST /v1/corpora/{id}/documents`` and ``DELETE
  /v1/corpora/{id}``; a request drafts from the corpus its ``corpus`` field names, and from
  the ``documents`` it carries.
"""

from __future__ import annotations

import abc
import json
import threading
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CallDocuments",
    "CorpusClient",
    "CorpusError",
    "CorpusWarning",
    "LookaheadCorpora",
    "SGLangCorpora",
]


class CorpusError(RuntimeError):
    """The server refused or failed a corpus operation."""


class CorpusWarning(UserWarning):
    """A corpus the server did not remove: what was answered is kept, the removal retried later."""


@dataclass(frozen=True)
class CallDocuments:
    """How one call's documents reach the server.

    Attributes:
        fields: Fields the call's request body carries (the ``openai`` client's ``extra_body``).
        corpus_id: A corpus loaded for this call alone, removed when the call ends.
    """

    fields: dict[str, Any] = field(default_factory=dict)
    corpus_id: str | None = None


class CorpusClient(abc.ABC):
    """The corpus endpoints of one server, over the engine's ``openai`` client (its timeouts,
    retries and key)."""

    #: Whether a scope's later documents join its first corpus (else each `add` loads one more).
    extendable = False

    def __init__(self, client: Any, root_url: str) -> None:
        """``root_url``: the URL the endpoints' paths are below (SGLang's root; rag-lookahead's
        ``/v1``)."""
        self._client = client
        self._root = root_url
        self._stranded: list[str] = []
        self._lock = threading.Lock()

    @property
    def stranded(self) -> tuple[str, ...]:
        """Corpora whose removal failed, retried at the next `remove_all`."""
        return tuple(self._stranded)

    @abc.abstractmethod
    def add(self, documents: Sequence[str]) -> str:
        """Load ``documents`` as a new corpus; returns its id."""

    def extend(self, corpus_id: str, documents: Sequence[str]) -> None:
        """Add ``documents`` to a loaded corpus (when `extendable`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot add documents to a loaded corpus")

    @abc.abstractmethod
    def remove(self, corpus_id: str) -> None:
        """Remove a loaded corpus."""

    @abc.abstractmethod
    def for_call(self, documents: Sequence[str], scope_ids: Sequence[str]) -> CallDocuments:
        """How a call sends ``documents`` (its own, non-empty texts), with its scope's corpora
        ``scope_ids`` loaded already."""

    def list(self) -> dict[str, int]:
        """Loaded corpora and their sizes."""
        raise NotImplementedError(f"{type(self).__name__} has no list of corpora")

    def remove_all(self, corpus_ids: Sequence[str]) -> Exception | None:
        """Remove ``corpus_ids`` and retry the stranded ones; returns the first failure among
        ``corpus_ids`` (a stranded one failing again was reported before).

        Every removal is tried, and each that fails is kept as stranded, to be retried at the
        next call: a server that was briefly unreachable does not keep a corpus for good.
        """
        with self._lock:
            retried, self._stranded = self._stranded, []
        failure: Exception | None = None
        for corpus_id in [*corpus_ids, *retried]:
            try:
                self.remove(corpus_id)
            except Exception as err:
                with self._lock:
                    self._stranded.append(corpus_id)
                if failure is None and corpus_id not in retried:
                    failure = err
        return failure

    def warn(self, failure: Exception, what: str) -> None:
        """Report a failed removal that must not cost ``what`` its answer (or its caller's)."""
        warnings.warn(
            f"the server at {self._root} did not remove the corpus of {what} ({failure}); the "
            f"answer stands, and the removal is retried when the next call or scope ends",
            CorpusWarning,
            stacklevel=3,
        )

    def _json(self, method: str, endpoint: str, body: dict[str, Any] | None) -> Any:
        """The server's JSON answer at ``endpoint`` (a path below the root); an HTTP error is
        the ``openai`` client's, raised after its retries."""
        url = f"{self._root}/{endpoint}"
        if method == "post":
            text = self._client.post(url, cast_to=str, body=body)
        elif method == "delete":
            text = self._client.delete(url, cast_to=str)
        else:
            text = self._client.get(url, cast_to=str)
        try:
            return json.loads(text)
        except ValueError:
            raise CorpusError(f"{endpoint} answered something other than JSON: {text[:200]!r}") from None


class SGLangCorpora(CorpusClient):
    """SGLang's external corpora: a call's documents load as a corpus of their own, and each
    `add` of a scope as one more."""

    def add(self, documents: Sequence[str]) -> str:
        corpus_id = f"rag-lookahead-{uuid.uuid4().hex}"
        body = {"corpus_id": corpus_id, "documents": list(documents)}
        answer = self._call("post", "add_external_corpus", body)
        return str(answer.get("corpus_id") or corpus_id)

    def remove(self, corpus_id: str) -> None:
        self._call("post", "remove_external_corpus", {"corpus_id": corpus_id})

    def for_call(self, documents: Sequence[str], scope_ids: Sequence[str]) -> CallDocuments:
        # Server-wide corpora: the scope's are in use already, the call's own are loaded now.
        return CallDocuments(corpus_id=self.add(documents) if documents else None)

    def list(self) -> dict[str, int]:
        """Loaded corpora (every client's) and their token counts."""
        answer = self._call("get", "list_external_corpora", None)
        counts = answer.get("corpus_token_counts") or {}
        if not isinstance(counts, dict):
            raise CorpusError(f"list_external_corpora answered an unexpected shape: {answer!r}")
        return {str(k): int(v) for k, v in counts.items()}

    def _call(self, method: str, endpoint: str, body: dict[str, Any] | None) -> dict[str, Any]:
        answer = self._json(method, endpoint, body)
        if not isinstance(answer, dict) or answer.get("success") is False:
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise CorpusError(f"{endpoint} failed: {message}")
        return answer


class LookaheadCorpora(CorpusClient):
    """The corpora of a ``rag-lookahead serve`` server: one per scope, grown by each `add`,
    named by the scope's calls; a call's own documents travel in its request."""

    extendable = True

    def add(self, documents: Sequence[str]) -> str:
        answer = self._json("post", "corpora", {"documents": list(documents)})
        corpus_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(corpus_id, str) or not corpus_id:
            raise CorpusError(f"POST /v1/corpora answered without a corpus id: {answer!r}")
        return corpus_id

    def extend(self, corpus_id: str, documents: Sequence[str]) -> None:
        self._json("post", f"corpora/{corpus_id}/documents", {"documents": list(documents)})

    def remove(self, corpus_id: str) -> None:
        try:
            self._json("delete", f"corpora/{corpus_id}", None)
        except Exception as err:
            # 404: expired already (or deleted by another holder of its id), gone either way.
            if getattr(err, "status_code", None) != 404:
                raise

    def for_call(self, documents: Sequence[str], scope_ids: Sequence[str]) -> CallDocuments:
        fields: dict[str, Any] = {"documents": list(documents)} if documents else {}
        if scope_ids:
            fields["corpus"] = scope_ids[0]
        return CallDocuments(fields)
