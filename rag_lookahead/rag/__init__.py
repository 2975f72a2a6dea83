"""Retrieval for RAG: load documents, cut them into chunks along their structure, embed them,
index their words, and search them (dense, keyword or hybrid).

```python
from rag_lookahead.rag import DocumentIndex, SentenceTransformerEmbedder

index, skipped = DocumentIndex.build(["docs/"], SentenceTransformerEmbedder())
index.save("docs.index")
hits = DocumentIndex.load("docs.index").search("How do I rotate the keys?", k=4, mode="hybrid")
```
"""

from rag_lookahead.rag.chunking import Chunk, ChunkingConfig, split_document
from rag_lookahead.rag.documents import Document, Skipped, load_documents
from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, Embedder, SentenceTransformerEmbedder
from rag_lookahead.rag.index import (
    RETRIEVAL_MODES,
    BuildTimings,
    DocumentIndex,
    Hit,
    IndexFormatError,
    Progress,
    RetrievalMode,
    UpdateReport,
)
from rag_lookahead.rag.pipeline import (
    Answer,
    AnswerStream,
    PreparedQuery,
    RagPipeline,
    RetrievalConfig,
)

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
