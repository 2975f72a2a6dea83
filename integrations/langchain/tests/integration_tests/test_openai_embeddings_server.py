"""LangChain's own `OpenAIEmbeddings` (langchain-openai, unmodified) pointed at `rag-lookahead
serve --backend local` on 127.0.0.1: documents and queries, sync and async, get the built-in
embedder's vectors.

Configured as LangChain documents it for an OpenAI-compatible server:
``check_embedding_ctx_length=False`` sends text. (Left on, LangChain first tokenizes with
tiktoken's ``cl100k_base`` on the client, which this offline machine cannot fetch; the server
reads such ids as OpenAI's tokens, or refuses them with that fix: see tests/test_embeddings_route.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from langchain_openai import OpenAIEmbeddings

from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, SentenceTransformerEmbedder
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.testing.local_server import LiveServer, served_engine

pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])  # the loopback server only

DOCUMENTS = [
    "The Normans were the people who gave their name to Normandy, a region in France.",
    "Rollo was the first ruler of Normandy.",
]
QUESTION = "Who were the Normans?"


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="module")
def live(embedder: SentenceTransformerEmbedder) -> Iterator[LiveServer]:
    with LiveServer(
        create_app(served_engine(), ServeSettings(model_name="tiny"), embedder=embedder)
    ) as server:
        yield server


def embeddings(live: LiveServer) -> OpenAIEmbeddings:
    return OpenAIEmbeddings(
        model=DEFAULT_EMBEDDER,
        base_url=live.base_url,
        api_key="none",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )


def test_documents_and_query(live: LiveServer, embedder: SentenceTransformerEmbedder) -> None:
    client = embeddings(live)
    np.testing.assert_allclose(client.embed_documents(DOCUMENTS), embedder.embed(DOCUMENTS), atol=1e-6)
    np.testing.assert_allclose(client.embed_query(QUESTION), embedder.embed([QUESTION])[0], atol=1e-6)


def test_async(live: LiveServer, embedder: SentenceTransformerEmbedder) -> None:
    client = embeddings(live)
    vectors = asyncio.run(client.aembed_documents(DOCUMENTS))
    np.testing.assert_allclose(vectors, embedder.embed(DOCUMENTS), atol=1e-6)
