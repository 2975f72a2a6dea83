"""`LookaheadQueryEngine` over FAISS + MiniLM: the answers of lookahead off, with every retrieved
node in the trie while the query is synthesized and out of it afterwards."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.bridge.pydantic import BaseModel
from llama_index.core.llms import MockLLM

from llama_index.llms.rag_lookahead import LookaheadLLM, LookaheadQueryEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from tests.integration_tests.shared import MAX_NEW_TOKENS, CallSpy

TOP_K = 3
# Synthesis set-ups making several LLM calls: refine makes one per node; a context window this
# small (LlamaIndex keeps 500 tokens of padding) makes compact pack the nodes into two prompts.
MULTI_CALL = {
    "compact": {"response_mode": "compact", "context_window": 700},
    "refine": {"response_mode": "refine"},
}


@pytest.fixture(scope="module")
def question(records: list[dict[str, Any]]) -> str:
    return records[1]["question"]


@pytest.fixture(scope="module")
def expected(index: Any, plain_llm: LookaheadLLM, question: str) -> str:
    """The default (compact, one call) answer with lookahead off."""
    return str(query_engine(index, plain_llm).query(question))


def query_engine(
    index: Any, llm: LookaheadLLM, context_window: int | None = None, **kwargs: Any
) -> LookaheadQueryEngine:
    if context_window is not None:
        llm = LookaheadLLM(
            engine=llm.engine,
            lookahead=llm.lookahead,
            context_window=context_window,
            max_new_tokens=MAX_NEW_TOKENS,
        )
    return LookaheadQueryEngine.from_index(index, llm=llm, similarity_top_k=TOP_K, **kwargs)


def assert_scoped(spy: CallSpy, retrieved: int, min_calls: int = 1) -> str:
    """Every LLM call saw one query scope holding all retrieved nodes; return its owner."""
    assert len(spy.calls) >= min_calls, spy.calls
    owners = {call["owner"] for call in spy.calls}
    assert len(owners) == 1 and None not in owners, spy.calls
    for call in spy.calls:
        assert call["documents"] == retrieved
        assert call["nodes_in_trie"] > 0
    return owners.pop()


@pytest.mark.parametrize("mode", list(MULTI_CALL))
def test_several_calls_same_answer_as_lookahead_off_with_all_nodes_in_the_trie(
    mode: str, index: Any, llm: LookaheadLLM, plain_llm: LookaheadLLM, spy: CallSpy, question: str
) -> None:
    settings = MULTI_CALL[mode]
    reference = query_engine(index, plain_llm, **settings).query(question)
    spy.calls.clear()

    response = query_engine(index, llm, **settings).query(question)

    assert str(response) == str(reference) and str(response).strip()
    assert len(response.source_nodes) == TOP_K
    owner = assert_scoped(spy, TOP_K, min_calls=2)
    assert owner not in llm.engine.trie.owners()  # eliminated once synthesis ended


def test_async_tasks_of_a_sync_query_see_the_nodes(
    index: Any, llm: LookaheadLLM, spy: CallSpy, question: str
) -> None:
    # tree_summarize with use_async runs its calls as tasks in LlamaIndex's `asyncio_run`.
    engine = query_engine(index, llm, response_mode="tree_summarize", use_async=True)
    response = engine.query(question)
    assert str(response).strip()
    owner = assert_scoped(spy, TOP_K)
    assert owner not in llm.engine.trie.owners()


def new_owners(llm: LookaheadLLM, before: set[str]) -> set[str]:
    """Owners of trie branches added since ``before`` (model outputs, which stay, aside)."""
    return llm.engine.trie.owners() - before - {OUTPUT_OWNER}


def test_streaming_response_keeps_the_nodes_until_it_is_consumed(
    index: Any, llm: LookaheadLLM, spy: CallSpy, question: str, expected: str
) -> None:
    before = llm.engine.trie.owners()
    spy.calls.clear()
    response = query_engine(index, llm, streaming=True).query(question)

    assert isinstance(response, StreamingResponse)
    (scope_owner,) = new_owners(llm, before)  # in the trie, though nothing is generated yet
    pieces = list(response.response_gen)  # LlamaIndex makes the LLM call only now
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == expected
    assert assert_scoped(spy, TOP_K) == scope_owner
    assert not new_owners(llm, before)


def test_abandoned_streaming_responses_release_the_nodes(
    index: Any, llm: LookaheadLLM, question: str
) -> None:
    engine = query_engine(index, llm, streaming=True)
    before = llm.engine.trie.owners()

    closed = engine.query(question)
    next(closed.response_gen)
    assert new_owners(llm, before)  # the scope and the running call's own branches
    closed.response_gen.close()
    assert not new_owners(llm, before)

    never_read = engine.query(question)
    assert new_owners(llm, before)
    del never_read
    gc.collect()
    assert not new_owners(llm, before)


def test_async_query_and_async_streaming(
    index: Any, llm: LookaheadLLM, spy: CallSpy, question: str, expected: str
) -> None:
    spy.calls.clear()

    async def run() -> tuple[str, str]:
        response = await query_engine(index, llm).aquery(question)
        before = llm.engine.trie.owners()
        streaming = await query_engine(index, llm, streaming=True).aquery(question)
        assert isinstance(streaming, AsyncStreamingResponse)
        assert new_owners(llm, before)
        text = "".join([token async for token in streaming.async_response_gen()])
        return str(response), text

    text, streamed = asyncio.run(run())
    assert text == expected and streamed == expected
    assert len(spy.calls) == 2
    for call in spy.calls:
        assert call["documents"] == TOP_K and call["nodes_in_trie"] > 0
        assert call["owner"] not in llm.engine.trie.owners()


def test_structured_output_keeps_the_lookahead_llm(index: Any, llm: LookaheadLLM) -> None:
    class Answer(BaseModel):
        text: str

    engine = LookaheadQueryEngine.from_index(index, llm=llm.as_structured_llm(Answer))
    assert engine.llm is llm  # the scope goes to the trie of the LLM under the wrapper
    assert isinstance(engine.with_retriever(index.as_retriever()), LookaheadQueryEngine)


def test_needs_a_lookahead_llm(index: Any) -> None:
    with pytest.raises(TypeError, match="LookaheadLLM"):
        LookaheadQueryEngine.from_index(index, llm=MockLLM())
