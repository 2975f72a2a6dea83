"""LlamaIndex's OpenAILikeEmbedding (llama-index-embeddings-openai-like, unmodified) against the
local server on 127.0.0.1: texts and queries, sync and async, batched, get the built-in
embedder's vectors (the server's ``/v1/embeddings``), as the embedder gives them in process.

It lives here rather than in the LlamaIndex integration's suite for its openai client: the
Agents SDK's openai >= 3 is the one installed beside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

openai_like = pytest.importorskip(
    "llama_index.embeddings.openai_like",
    reason="llama-index-embeddings-openai-like is installed by `make test-clients`",
)

from client_support import MODEL  # noqa: E402

from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, SentenceTransformerEmbedder  # noqa: E402
from rag_lookahead.serve import ServeSettings, create_app  # noqa: E402
from rag_lookahead.testing.local_server import LiveServer, served_engine  # noqa: E402

TEXTS = [
    "The Normans were the people who gave their name to Normandy, a region in France.",
    "Rollo was the first ruler of Normandy.",
    "Norman French was spoken at the English court.",
]
QUESTION = "Who were the Normans?"


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="module")
def embedding_live(embedder: SentenceTransformerEmbedder) -> Iterator[LiveServer]:
    app = create_app(served_engine(), ServeSettings(model_name=MODEL), embedder=embedder)
    with LiveServer(app) as server:
        yield server


def embedding(live: LiveServer, **kwargs: object) -> openai_like.OpenAILikeEmbedding:
    return openai_like.OpenAILikeEmbedding(
        model_name=DEFAULT_EMBEDDER, api_base=live.base_url, api_key="none", max_retries=1, **kwargs
    )


def test_texts_and_query(embedding_live: LiveServer, embedder: SentenceTransformerEmbedder) -> None:
    client = embedding(embedding_live, embed_batch_size=2)  # two requests: 2 texts, then 1
    expected = embedder.embed(TEXTS)
    np.testing.assert_allclose(client.get_text_embedding_batch(TEXTS), expected, atol=1e-6)
    np.testing.assert_allclose(client.get_text_embedding(TEXTS[1]), expected[1], atol=1e-6)
    np.testing.assert_allclose(client.get_query_embedding(QUESTION), embedder.embed([QUESTION])[0], atol=1e-6)


def test_async(embedding_live: LiveServer, embedder: SentenceTransformerEmbedder) -> None:
    client = embedding(embedding_live)
    vectors = asyncio.run(client.aget_text_embedding_batch(TEXTS))
    np.testing.assert_allclose(vectors, embedder.embed(TEXTS), atol=1e-6)
    query = asyncio.run(client.aget_query_embedding(QUESTION))
    np.testing.assert_allclose(query, embedder.embed([QUESTION])[0], atol=1e-6)


def test_the_model_s_own_dimensions(
    embedding_live: LiveServer, embedder: SentenceTransformerEmbedder
) -> None:
    client = embedding(embedding_live, dimensions=embedder.dimension)
    np.testing.assert_allclose(client.get_text_embedding(TEXTS[0]), embedder.embed(TEXTS[:1])[0], atol=1e-6)
