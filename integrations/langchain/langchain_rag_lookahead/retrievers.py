"""`LookaheadRetriever`: a LangChain retriever over a rag-lookahead `DocumentIndex`.

The index's dense, keyword or hybrid search (the default) behind LangChain's retriever
interface, so that the structure-aware chunks and the keyword side that finds exact names can
feed any chain, not only rag-lookahead's own pipeline. Each document carries its source, its
heading path and its scores in ``metadata``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

from rag_lookahead.rag import DocumentIndex, Hit
from rag_lookahead.rag.index import RetrievalMode, check_mode

__all__ = ["LookaheadRetriever", "hit_to_document"]


class LookaheadRetriever(BaseRetriever):
    """Chunks of a `DocumentIndex` as LangChain documents, best first.

    Example:
        ``LookaheadRetriever(index=DocumentIndex.load("docs.index"), k=4, mode="hybrid")``
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: DocumentIndex
    """The index to search (built with `DocumentIndex.build`, or loaded)."""
    k: int = Field(default=4, ge=1)
    """How many chunks to return (keyword mode may find fewer)."""
    mode: RetrievalMode = "hybrid"
    """``"hybrid"`` (keyword and dense rankings fused), ``"dense"`` or ``"keyword"``."""

    @field_validator("mode", mode="before")
    @classmethod
    def _known_mode(cls, value: object) -> RetrievalMode:
        return check_mode(value)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        k = kwargs.pop("k", self.k)
        if kwargs:
            raise TypeError(f"unexpected search arguments: {', '.join(sorted(kwargs))}")
        return [hit_to_document(hit) for hit in self.index.search(query, k, self.mode)]


def hit_to_document(hit: Hit) -> Document:
    """A retrieved chunk as a LangChain document (its id is the chunk's id)."""
    chunk = hit.chunk
    metadata = {
        "source": chunk.source,
        "headings": list(chunk.headings),
        "start": chunk.start,
        "end": chunk.end,
        "score": hit.score,
        "similarity": hit.similarity,
    }
    return Document(id=chunk.id, page_content=chunk.text, metadata=metadata)
