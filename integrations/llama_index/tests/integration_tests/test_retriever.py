"""`LookaheadRetriever`: rag-lookahead's hybrid index behind LlamaIndex's retriever interface."""

from __future__ import annotations

import asyncio
from functools import cache

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import MetadataMode

from llama_index.llms.rag_lookahead import LookaheadRetriever
from rag_lookahead.rag import Document, DocumentIndex, SentenceTransformerEmbedder

GUIDE = """# shlex

## shlex.split

`shlex.split(s)` splits a string into words using shell-like quoting rules.

## shlex.quote

`shlex.quote(s)` returns a shell-escaped version of the string.
"""


@cache
def guide_index() -> DocumentIndex:
    index = DocumentIndex(SentenceTransformerEmbedder())
    index.add([Document("shlex.md", GUIDE), Document("notes.txt", "Kettles descale with citric acid.")])
    return index


def test_nodes_carry_the_chunk_its_section_and_score() -> None:
    retriever = LookaheadRetriever(guide_index(), similarity_top_k=2)
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve("What does shlex.quote return?")
    assert len(nodes) == 2 and nodes[0].score >= nodes[1].score
    node = nodes[0].node
    assert node.get_content().startswith("`shlex.quote(s)`")
    assert node.metadata["section"] == "shlex > shlex.quote" and node.metadata["source"] == "shlex.md"
    shown = node.get_content(metadata_mode=MetadataMode.LLM)
    assert "section: shlex > shlex.quote" in shown and "similarity" not in shown


def test_async_retrieval_and_keyword_mode() -> None:
    retriever = LookaheadRetriever(guide_index(), similarity_top_k=4, mode="keyword")
    nodes = asyncio.run(retriever.aretrieve("citric acid"))
    assert [n.node.metadata["source"] for n in nodes] == ["notes.txt"]
    assert nodes[0].node.metadata["similarity"] is None


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"mode": "bm25"}, ValueError, "retrieval mode must be one of dense, keyword, hybrid"),
        ({"similarity_top_k": 0}, ValueError, "similarity_top_k must be a positive integer"),
        ({"similarity_top_k": True}, ValueError, "similarity_top_k must be a positive integer"),
    ],
)
def test_bad_settings_are_refused(kwargs, error, words) -> None:
    with pytest.raises(error, match=words):
        LookaheadRetriever(guide_index(), **kwargs)


def test_only_a_document_index_is_searched() -> None:
    with pytest.raises(TypeError, match="must be a rag-lookahead DocumentIndex, got dict"):
        LookaheadRetriever({})  # type: ignore[arg-type]
