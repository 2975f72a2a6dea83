"""`LookaheadRetriever`: LangChain's standard retriever tests, and what it adds (modes, metadata)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_rag_lookahead import LookaheadRetriever
from rag_lookahead.rag import Document, DocumentIndex, SentenceTransformerEmbedder

GUIDE = """# textwrap

## textwrap.dedent

`textwrap.dedent(text)` removes the whitespace prefix that every line of the text has in common.

## textwrap.indent

`textwrap.indent(text, prefix)` adds a prefix to the beginning of selected lines.

## textwrap.shorten

`textwrap.shorten(text, width)` collapses whitespace and truncates the text to fit a width.
"""


@cache
def guide_index() -> DocumentIndex:
    index = DocumentIndex(SentenceTransformerEmbedder())
    index.add([Document("textwrap.md", GUIDE), Document("notes.txt", "Kettles descale with citric acid.")])
    return index


class TestLookaheadRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return LookaheadRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"index": guide_index()}

    @property
    def retriever_query_example(self) -> str:
        return "How do I remove common indentation?"


def test_documents_carry_the_chunk_its_headings_and_scores() -> None:
    documents = LookaheadRetriever(index=guide_index(), k=2).invoke("What does textwrap.dedent do?")
    first = documents[0]
    assert first.page_content.startswith("`textwrap.dedent(text)`")
    assert first.metadata["headings"] == ["textwrap", "textwrap.dedent"]
    assert first.metadata["source"] == "textwrap.md" and first.id == guide_index().chunks[0].id
    assert first.metadata["score"] > 0 and 0 < first.metadata["similarity"] <= 1


def test_keyword_mode_finds_only_shared_words() -> None:
    retriever = LookaheadRetriever(index=guide_index(), k=4, mode="keyword")
    documents = retriever.invoke("citric acid")
    assert [d.metadata["source"] for d in documents] == ["notes.txt"]
    assert documents[0].metadata["similarity"] is None


@pytest.mark.parametrize("mode", ["bm25", "", 3])
def test_an_unknown_mode_is_refused(mode) -> None:
    with pytest.raises(ValueError, match="retrieval mode must be one of dense, keyword, hybrid"):
        LookaheadRetriever(index=guide_index(), mode=mode)


def test_k_must_be_positive_and_unknown_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        LookaheadRetriever(index=guide_index(), k=0)
    with pytest.raises(TypeError, match="unexpected search arguments: fetch_k"):
        LookaheadRetriever(index=guide_index()).invoke("dedent", fetch_k=9)
