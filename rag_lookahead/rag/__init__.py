"""Retrieval for RAG: load documents, cut them into chunks along their structure, embed them,
index their words, and search them (dense, keyword or hybrid).

```python
from rag_lookahead.rag import DocumentIndex, SentenceTransformerEmbedder

index, skipped = DocumentIndex.build(["docs/"], SentenceTransformerEmbedder())
index.save("docs.index")
hits = DocumentIndex.load("docs.index").search("How do I rotate the keys?", k=4, mode="hybrid")
```

Its names are imported when first used (`rag_lookahead.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_lookahead.lazy import lazy_attributes

if TYPE_CHECKING:
    from rag_lookahead.rag.chunking import Chunk, ChunkingConfig, split_document
    from rag_lookahead.rag.documents import Document, Skipped, load_documents
    from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, Embedder, SentenceTransformerEmbedder
    from rag_lookahead.rag.index import (
        BuildTimings,
        DocumentIndex,
        Hit,
        IndexFormatError,
        Progress,
        UpdateReport,
    )
    from rag_lookahead.rag.pipeline import Answer, AnswerStream, PreparedQuery, RagPipeline
    from rag_lookahead.rag.retrieval import RETRIEVAL_MODES, RetrievalConfig, RetrievalMode

__all__ = [
    "DEFAULT_EMBEDDER",
    "RETRIEVAL_MODES",
    "Answer",
    "AnswerStream",
    "BuildTimings",
    "Chunk",
    "ChunkingConfig",
    "Document",
    "DocumentIndex",
    "Embedder",
    "Hit",
    "IndexFormatError",
    "PreparedQuery",
    "Progress",
    "RagPipeline",
    "RetrievalConfig",
    "RetrievalMode",
    "SentenceTransformerEmbedder",
    "Skipped",
    "UpdateReport",
    "load_documents",
    "split_document",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "DocumentIndex": "rag_lookahead.rag.index",
        "SentenceTransformerEmbedder": "rag_lookahead.rag.embedding",
        "Chunk": "rag_lookahead.rag.chunking",
        "ChunkingConfig": "rag_lookahead.rag.chunking",
        "split_document": "rag_lookahead.rag.chunking",
        "Document": "rag_lookahead.rag.documents",
        "Skipped": "rag_lookahead.rag.documents",
        "load_documents": "rag_lookahead.rag.documents",
        "DEFAULT_EMBEDDER": "rag_lookahead.rag.embedding",
        "Embedder": "rag_lookahead.rag.embedding",
        "RETRIEVAL_MODES": "rag_lookahead.rag.retrieval",
        "BuildTimings": "rag_lookahead.rag.index",
        "Hit": "rag_lookahead.rag.index",
        "IndexFormatError": "rag_lookahead.rag.index",
        "Progress": "rag_lookahead.rag.index",
        "RetrievalMode": "rag_lookahead.rag.retrieval",
        "UpdateReport": "rag_lookahead.rag.index",
        "Answer": "rag_lookahead.rag.pipeline",
        "AnswerStream": "rag_lookahead.rag.pipeline",
        "PreparedQuery": "rag_lookahead.rag.pipeline",
        "RagPipeline": "rag_lookahead.rag.pipeline",
        "RetrievalConfig": "rag_lookahead.rag.retrieval",
    },
)
