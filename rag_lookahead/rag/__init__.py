"""Retrieval for RAG: load documents, cut them into chunks, embed them and search them.

```python
from rag_lookahead.rag import DocumentIndex, SentenceTransformerEmbedder

index, skipped = DocumentIndex.build(["docs/"], SentenceTransformerEmbedder())
index.save("docs.index")
hits = DocumentIndex.load("docs.index").search("How do I rotate the keys?", k=4)
```
"""

from rag_lookahead.rag.chunking import Chunk, ChunkingConfig, split_document
from rag_lookahead.rag.documents import Document, Skipped, load_documents
from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, Embedder, SentenceTransformerEmbedder
from rag_lookahead.rag.index import DocumentIndex, Hit, IndexFormatError, Progress, UpdateReport
from rag_lookahead.rag.pipeline import (
    Answer,
    AnswerStream,
    PreparedQuery,
    RagPipeline,
    RetrievalConfig,
)

__all__ = [
    "DEFAULT_EMBEDDER",
    "Answer",
    "AnswerStream",
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
    "SentenceTransformerEmbedder",
    "Skipped",
    "UpdateReport",
    "load_documents",
    "split_document",
]
