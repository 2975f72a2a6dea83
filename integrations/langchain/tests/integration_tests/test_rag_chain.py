"""An LCEL RAG chain (FAISS retriever | prompt | ChatLookahead | parser) on the real model:
the same answers as with lookahead off, the run's documents in the trie only during its calls,
stop sequences, streaming callbacks, async and batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough

from langchain_rag_lookahead import ChatLookahead, LookaheadCallbackHandler
from rag_lookahead import LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from tests.integration_tests.corpus import sample_store
from tests.integration_tests.shared import shared_engine

pytestmark = pytest.mark.model

MAX_TOKENS = 24
PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer the question using the context. Quote the context where it answers."),
        ("human", "Context:\n{context}\n\nQuestion: {question}"),
    ]
)


class Recorder(BaseCallbackHandler):
    """Tokens, trie owners seen while the model streams, and each call's lookahead stats."""

    def __init__(self, engine: LookaheadEngine) -> None:
        self.engine = engine
        self.tokens: list[str] = []
        self.owners: list[set[str]] = []
        self.stats: list[dict[str, Any]] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)
        self.owners.append(set(self.engine.trie.owners()))

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.stats.append(response.generations[0][0].message.response_metadata["lookahead"])

    def scope_owners(self) -> set[str]:
        return {o for owners in self.owners for o in owners if o.startswith("scope-")}


def format_docs(documents: Sequence[Document]) -> str:
    return "\n\n".join(doc.page_content for doc in documents)


def rag_chain(llm: Runnable, retriever: Runnable) -> Runnable:
    return (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], Runnable]:
    questions, store = sample_store()
    return questions, store.as_retriever(search_kwargs={"k": 2})


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return shared_engine()


@pytest.fixture(scope="module")
def references(corpus, engine) -> dict[str, str]:
    """Each question's answer from the same chain with lookahead off."""
    questions, retriever = corpus
    plain = rag_chain(ChatLookahead(engine=engine, lookahead=False, max_tokens=MAX_TOKENS), retriever)
    return dict(zip(questions, plain.batch(questions), strict=True))


def test_lookahead_chain_answers_exactly_as_without_and_uses_the_documents(
    corpus, engine, references
) -> None:
    questions, retriever = corpus
    handler, recorder = LookaheadCallbackHandler(), Recorder(engine)
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=MAX_TOKENS), retriever)
    for question in questions:
        assert chain.invoke(question, config={"callbacks": [handler, recorder]}) == references[question]
    assert len(recorder.scope_owners()) == len(questions)  # each run's documents, during its call
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # and none after
    assert handler.active_runs == 0
    assert sum(sum(s["accepted_per_step"]) for s in recorder.stats) > 0  # drafts were accepted


def test_stop_sequence_in_the_chain(corpus, engine, references) -> None:
    questions, retriever = corpus
    reference = references[questions[1]]
    words = reference.split()
    stop = " " + words[len(words) // 2]
    expected = reference[: reference.index(stop)]
    llm = ChatLookahead(engine=engine, max_tokens=MAX_TOKENS).bind(stop=[stop])
    assert rag_chain(llm, retriever).invoke(questions[1]) == expected


def test_streaming_chain_reports_every_chunk(corpus, engine, references) -> None:
    questions, retriever = corpus
    recorder = Recorder(engine)
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=MAX_TOKENS), retriever)
    pieces = list(chain.stream(questions[0], config={"callbacks": [LookaheadCallbackHandler(), recorder]}))
    assert "".join(pieces) == references[questions[0]]
    assert "".join(recorder.tokens) == references[questions[0]]
    assert len(recorder.tokens) > 1 and recorder.scope_owners()


async def test_async_chain(corpus, engine, references) -> None:
    questions, retriever = corpus
    handler = LookaheadCallbackHandler()
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=MAX_TOKENS), retriever)
    assert await chain.ainvoke(questions[2], config={"callbacks": [handler]}) == references[questions[2]]
    assert handler.active_runs == 0 and engine.trie.owners() <= {OUTPUT_OWNER}


def test_batch_with_several_workers(corpus, engine, references) -> None:
    questions, retriever = corpus
    handler = LookaheadCallbackHandler()
    chain = rag_chain(ChatLookahead(engine=engine, max_tokens=MAX_TOKENS), retriever)
    answers = chain.batch(questions, config={"callbacks": [handler], "max_concurrency": 3})
    assert answers == [references[q] for q in questions]
    assert handler.active_runs == 0 and engine.trie.owners() <= {OUTPUT_OWNER}
