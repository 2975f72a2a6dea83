"""A small real corpus for chain tests: the Dolly sample bundled with rag-lookahead, in a FAISS
store with the offline all-MiniLM-L6-v2 embedder."""

from __future__ import annotations

import json
import warnings
from importlib import resources

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from rag_lookahead.rag import ChunkingConfig, SentenceTransformerEmbedder, split_document
from rag_lookahead.rag import Document as SourceDocument


class MiniLMEmbeddings(Embeddings):
    """LangChain embeddings over rag-lookahead's offline sentence-transformers embedder."""

    def __init__(self) -> None:
        self.embedder = SentenceTransformerEmbedder()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder.embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def sample_store() -> tuple[list[str], VectorStore]:
    """The sample's questions, and a FAISS store of its contexts cut into sentence chunks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # langchain-community announces its sunset on import
        from langchain_community.vectorstores import FAISS

    embeddings = MiniLMEmbeddings()
    lines = (resources.files("rag_lookahead") / "data" / "sample.jsonl").read_text("utf-8")
    records = [json.loads(line) for line in lines.splitlines() if line.strip()]
    config = ChunkingConfig(size=64, overlap=16, unit="sentences")
    chunks = [
        Document(page_content=chunk.text, metadata={"source": chunk.source})
        for record in records
        for chunk in split_document(
            SourceDocument(source=record["id"], text=record["context"]), config, embeddings.embedder.tokenizer
        )
    ]
    return [record["question"] for record in records], FAISS.from_documents(chunks, embeddings)
