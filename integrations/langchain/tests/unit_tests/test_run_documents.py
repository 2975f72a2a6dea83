"""Documents retrieved in a chain run reach the trie of that run's model calls, and leave it
when the run ends; on the tiny model, with a retriever whose documents hold the answer."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnablePassthrough

from langchain_rag_lookahead import (
    ChatLookahead,
    LookaheadCallbackHandler,
    LookaheadLLM,
    with_retrieved_documents,
)
from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.testing import tiny_engine
from tests.chains import QUESTION, FixedRetriever, N, answer_and_documents, rag_chain


class CallRecorder(BaseCallbackHandler):
    """Trie owners seen while the model streams, and each call's lookahead stats."""

    def __init__(self, engine: LookaheadEngine) -> None:
        self.engine = engine
        self.owners: list[set[str]] = []
        self.stats: list[dict[str, Any]] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.owners.append(set(self.engine.trie.owners()))

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        generation = response.generations[0][0]
        info = generation.generation_info or {}
        if "lookahead" not in info:
            info = generation.message.response_metadata
        self.stats.append(info["lookahead"])

    def scope_owners(self) -> set[str]:
        return {o for owners in self.owners for o in owners if o.startswith("scope-")}


@pytest.fixture
def setup() -> tuple[LookaheadEngine, str, list[Document]]:
    engine = tiny_engine()
    return (engine, *answer_and_documents(engine))


def test_retrieved_documents_are_in_the_trie_during_the_call_and_gone_after(setup) -> None:
    engine, reference, documents = setup
    handler, recorder = LookaheadCallbackHandler(), CallRecorder(engine)
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=N), documents)
    assert chain.invoke(QUESTION, config={"callbacks": [handler, recorder]}) == reference
    assert recorder.scope_owners()  # the run's documents, during the call
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # and gone after it
    assert handler.active_runs == 0

    # Without the handler the same chain drafts without them: same text, more steps.
    fresh = tiny_engine()
    plain = CallRecorder(fresh)
    assert (
        rag_chain(ChatLookahead(engine=fresh, max_tokens=N), documents).invoke(
            QUESTION, config={"callbacks": [plain]}
        )
        == reference
    )
    assert not plain.scope_owners()
    assert recorder.stats[0]["steps"] < plain.stats[0]["steps"]


def test_streaming_chain(setup) -> None:
    engine, reference, documents = setup
    recorder = CallRecorder(engine)
    chain = with_retrieved_documents(rag_chain(ChatLookahead(engine=engine, max_tokens=N), documents))
    assert "".join(chain.stream(QUESTION, config={"callbacks": [recorder]})) == reference
    assert recorder.scope_owners()
    assert engine.trie.owners() <= {OUTPUT_OWNER}


async def test_async_chain(setup) -> None:
    engine, reference, documents = setup
    recorder = CallRecorder(engine)
    chain = with_retrieved_documents(rag_chain(ChatLookahead(engine=engine, max_tokens=N), documents))
    assert await chain.ainvoke(QUESTION, config={"callbacks": [recorder]}) == reference
    assert "".join([c async for c in chain.astream(QUESTION, config={"callbacks": [recorder]})]) == reference
    assert len(recorder.scope_owners()) == 2  # one scope per run
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_completion_model_in_a_chain(setup) -> None:
    engine, _, documents = setup
    llm = LookaheadLLM(engine=engine, max_tokens=N)
    recorder = CallRecorder(engine)
    text = with_retrieved_documents(rag_chain(llm, documents)).invoke(
        QUESTION, config={"callbacks": [recorder]}
    )
    assert text == LookaheadLLM(engine=engine, max_tokens=N, lookahead=False).invoke(QUESTION)
    assert recorder.scope_owners()
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_batch_of_runs_keeps_each_runs_documents_apart(setup) -> None:
    engine, reference, documents = setup
    handler, recorder = LookaheadCallbackHandler(), CallRecorder(engine)
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=N), documents)
    results = chain.batch([QUESTION] * 4, config={"callbacks": [handler, recorder], "max_concurrency": 3})
    assert results == [reference] * 4
    assert len(recorder.scope_owners()) == 4
    assert handler.active_runs == 0 and engine.trie.owners() <= {OUTPUT_OWNER}


def test_several_calls_of_one_run_share_its_scope(setup) -> None:
    engine, _, documents = setup
    recorder = CallRecorder(engine)
    llm = ChatLookahead(engine=engine, max_tokens=8)
    chain = rag_chain(llm, documents) | llm | StrOutputParser()
    with_retrieved_documents(chain).invoke(QUESTION, config={"callbacks": [recorder]})
    assert len(recorder.stats) == 2 and len(recorder.scope_owners()) == 1
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_a_stream_left_early_ends_its_run(setup) -> None:
    engine, _, documents = setup
    handler = LookaheadCallbackHandler()
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=N), documents)
    stream = chain.stream(QUESTION, config={"callbacks": [handler]})
    next(stream)
    assert handler.active_runs == 1 and any(o.startswith("scope-") for o in engine.trie.owners())
    stream.close()
    assert handler.active_runs == 0 and engine.trie.owners() <= {OUTPUT_OWNER}


def test_documents_that_never_reach_a_model_do_not_linger(setup) -> None:
    engine, _, documents = setup
    handler = LookaheadCallbackHandler()
    retriever = FixedRetriever(documents=documents)
    assert (retriever | RunnableLambda(len)).invoke(QUESTION, config={"callbacks": [handler]}) == 2
    assert retriever.invoke(QUESTION, config={"callbacks": [handler]}) == documents

    def fail(_: Any) -> None:
        raise RuntimeError("the chain fails before its model call")

    failing = RunnableParallel(docs=retriever, q=RunnablePassthrough()) | RunnableLambda(fail)
    with pytest.raises(RuntimeError):
        failing.invoke(QUESTION, config={"callbacks": [handler]})
    assert handler.active_runs == 0
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_plain_decoding_inserts_nothing(setup) -> None:
    engine, reference, documents = setup
    off = ChatLookahead(engine=engine, max_tokens=N, lookahead=False)
    recorder = CallRecorder(off.get_engine())
    assert (
        with_retrieved_documents(rag_chain(off, documents)).invoke(QUESTION, config={"callbacks": [recorder]})
        == reference
    )
    assert not recorder.scope_owners()


def test_a_handler_on_an_inner_chain_scopes_to_that_chain(setup) -> None:
    engine, reference, documents = setup
    handler, recorder = LookaheadCallbackHandler(), CallRecorder(engine)
    inner = rag_chain(ChatLookahead(engine=engine, max_tokens=N), documents).with_config(
        callbacks=[handler, recorder]
    )
    outer = RunnableLambda(lambda q: q) | inner | RunnableLambda(lambda text: text.upper())
    assert outer.invoke(QUESTION) == reference.upper()
    assert recorder.scope_owners()
    assert handler.active_runs == 0 and engine.trie.owners() <= {OUTPUT_OWNER}


def test_two_variants_of_one_engine_in_one_run_share_its_scope(setup) -> None:
    engine, _, documents = setup
    recorder = CallRecorder(engine)
    variant = engine.with_config(LookaheadConfig(mode="trie", min_query_length=1, decoding_length=4))
    first, second = ChatLookahead(engine=engine, max_tokens=8), ChatLookahead(engine=variant, max_tokens=8)
    chain = rag_chain(first, documents) | second | StrOutputParser()
    with_retrieved_documents(chain).invoke(QUESTION, config={"callbacks": [recorder]})
    # One trie, one scope: the run's documents were inserted once, not once per variant.
    assert len(recorder.stats) == 2 and len(recorder.scope_owners()) == 1
    assert engine.trie.owners() <= {OUTPUT_OWNER}
