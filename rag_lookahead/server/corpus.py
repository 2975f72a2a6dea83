"""SGLang's external n-gram corpora: documents its NGRAM drafter draws from, added at run time.

SGLang (``--speculative-algorithm NGRAM`` with an external SAM budget) serves three endpoints
beside its OpenAI API: ``POST /add_external_corpus`` with ``{"corpus_id", "documents"}``,
``POST /remove_external_corpus`` with ``{"corpus_id"}``, and ``GET /list_external_corpora``.
Each answers ``{"success": ..., "message": ...}`` (400 on failure). A corpus is server-wide:
every request on the server may draft from it while it is loaded.
"""

from __future__ import annotations

import json
import threading
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["CorpusClient", "CorpusError", "CorpusWarning"]


class CorpusError(RuntimeError):
    """The server refused or failed a corpus operation."""


class CorpusWarning(UserWarning):
    """A corpus the server did not remove: what was answered is kept, the removal retried later."""


class CorpusClient:
    """The corpus endpoints of one SGLang server, over the engine's ``openai`` client (its
    timeouts, retries and key)."""

    def __init__(self, client: Any, root_url: str) -> None:
        self._client = client
        self._root = root_url
        self._stranded: list[str] = []
        self._lock = threading.Lock()

    @property
    def stranded(self) -> tuple[str, ...]:
        """Corpora whose removal failed, retried at the next `remove_all`."""
        return tuple(self._stranded)

    def add(self, documents: Sequence[str]) -> str:
        """Load ``documents`` as a new corpus; returns its id."""
        corpus_id = f"rag-lookahead-{uuid.uuid4().hex}"
        body = {"corpus_id": corpus_id, "documents": list(documents)}
        answer = self._call("post", "add_external_corpus", body)
        return str(answer.get("corpus_id") or corpus_id)

    def remove(self, corpus_id: str) -> None:
        self._call("post", "remove_external_corpus", {"corpus_id": corpus_id})

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

    def list(self) -> dict[str, int]:
        """Loaded corpora and their token counts."""
        answer = self._call("get", "list_external_corpora", None)
        counts = answer.get("corpus_token_counts") or {}
        if not isinstance(counts, dict):
            raise CorpusError(f"list_external_corpora answered an unexpected shape: {answer!r}")
        return {str(k): int(v) for k, v in counts.items()}

    def _call(self, method: str, endpoint: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = f"{self._root}/{endpoint}"
        if method == "post":
            text = self._client.post(url, cast_to=str, body=body)
        else:
            text = self._client.get(url, cast_to=str)
        try:
            answer = json.loads(text)
        except ValueError:
            raise CorpusError(f"{endpoint} answered something other than JSON: {text[:200]!r}") from None
        if not isinstance(answer, dict) or answer.get("success") is False:
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise CorpusError(f"{endpoint} failed: {message}")
        return answer
