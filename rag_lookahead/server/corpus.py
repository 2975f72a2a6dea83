"""SGLang's external n-gram corpora: documents its NGRAM drafter draws from, added at run time.

SGLang (``--speculative-algorithm NGRAM`` with an external SAM budget) serves three endpoints
beside its OpenAI API: ``POST /add_external_corpus`` with ``{"corpus_id", "documents"}``,
``POST /remove_external_corpus`` with ``{"corpus_id"}``, and ``GET /list_external_corpora``.
Each answers ``{"success": ..., "message": ...}`` (400 on failure). A corpus is server-wide:
every request on the server may draft from it while it is loaded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = ["CorpusClient", "CorpusError"]


class CorpusError(RuntimeError):
    """The server refused or failed a corpus operation."""


class CorpusClient:
    """The corpus endpoints of one SGLang server, over the engine's ``openai`` client (its
    timeouts, retries and key)."""

    def __init__(self, client: Any, root_url: str) -> None:
        self._client = client
        self._root = root_url

    def add(self, documents: Sequence[str]) -> str:
        """Load ``documents`` as a new corpus; returns its id."""
        corpus_id = f"rag-lookahead-{uuid.uuid4().hex}"
        body = {"corpus_id": corpus_id, "documents": list(documents)}
        answer = self._call("post", "add_external_corpus", body)
        return str(answer.get("corpus_id") or corpus_id)

    def remove(self, corpus_id: str) -> None:
        self._call("post", "remove_external_corpus", {"corpus_id": corpus_id})

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
