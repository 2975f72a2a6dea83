"""Nodes retrieved outside a `LookaheadQueryEngine` (chat engines, routers, user code) reach the
`LookaheadLLM` calls of the same run, and only those, through LlamaIndex's instrumentation."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from typing import Any

import llama_index.core.instrumentation as instrument
import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.base_selector import BaseSelector, SelectorResult, SingleSelection
from llama_index.core.base.response.schema import StreamingResponse
from llama_index.core.bridge.pydantic import BaseModel, Field
from llama_index.core.chat_engine.types import StreamingAgentChatResponse
from llama_index.core.query_engine import RetrieverQueryEngine, RouterQueryEngine
from llama_index.core.schema import MetadataMode, QueryBundle
from llama_index.core.tools import FunctionTool, QueryEngineTool

from llama_index.llms.rag_lookahead import LookaheadLLM, RetrievalScopes
from rag_lookahead.drafting import OUTPUT_OWNER

TOP_K = 3
dispatcher = instrument.get_dispatcher(__name__)


class Calls:
    """The scope each engine call of the test was given: its owner and documents' token ids."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: list[Any] = []

    def owners(self) -> list[str | None]:
        return [s.owner if s is not None else None for s in self.scopes]


@pytest.fixture
def calls(llm: LookaheadLLM, monkeypatch: pytest.MonkeyPatch) -> Calls:
    engine = llm.engine
    stream = engine.stream
    recorded = Calls()

    def spy(prompt: Any, params: Any = None, *, scope: Any = None, **kwargs: Any) -> Any:
        with recorded.lock:
            recorded.scopes.append(scope)
        return stream(prompt, params, scope=scope, **kwargs)

    monkeypatch.setattr(engine, "stream", spy)
    return recorded


@pytest.fixture
def tracker(llm: LookaheadLLM) -> Iterator[RetrievalScopes]:
    scopes = RetrievalScopes.attach()
    assert scopes.attached and RetrievalScopes.attach() is scopes  # one per dispatcher
    yield scopes
    assert scopes.active_runs == 0  # every run of the test has ended and released its nodes


def tokens(llm: LookaheadLLM, nodes: Any) -> list[list[int]]:
    texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]
    return [list(llm.engine.tokenizer(t, add_special_tokens=False).input_ids) for t in texts]


def assert_run_scope(llm: LookaheadLLM, scope: Any, nodes: Any) -> None:
    """``scope`` held exactly the run's retrieved nodes and has left the trie since."""
    assert scope is not None
    assert sorted(map(list, scope.sequences)) == sorted(tokens(llm, nodes))
    assert scope.closed and scope.owner not in llm.engine.trie.owners()


def new_owners(llm: LookaheadLLM, before: set[str]) -> set[str]:
    return llm.engine.trie.owners() - before - {OUTPUT_OWNER}


def assert_run_released(llm: LookaheadLLM, calls: Calls, nodes: Any, before: set[str]) -> None:
    """Once the run's objects are collected: its one call's scope held the run's ``nodes`` and
    has left the trie, and nothing else of the run is in it."""
    gc.collect()
    (scope,) = calls.scopes
    assert_run_scope(llm, scope, nodes)
    assert not new_owners(llm, before)


def test_context_chat_engine_drafts_from_its_retrieved_nodes(
    index: Any,
    llm: LookaheadLLM,
    plain_llm: LookaheadLLM,
    records: list[dict[str, Any]],
    calls: Calls,
    tracker: RetrievalScopes,
) -> None:
    question = records[1]["question"]
    reference = index.as_chat_engine(chat_mode="context", llm=plain_llm, similarity_top_k=TOP_K).chat(
        question
    )
    assert set(calls.scopes) <= {None}  # lookahead off: no scope (nothing would draft from it)
    calls.scopes.clear()

    response = index.as_chat_engine(chat_mode="context", llm=llm, similarity_top_k=TOP_K).chat(question)

    assert str(response) == str(reference) and str(response).strip()
    (scope,) = calls.scopes
    assert_run_scope(llm, scope, response.source_nodes)


def test_streaming_chat_keeps_the_nodes_while_its_answer_is_decoded(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    before = llm.engine.trie.owners()
    chat_engine = index.as_chat_engine(chat_mode="condense_plus_context", llm=llm, similarity_top_k=TOP_K)
    response = chat_engine.stream_chat(records[2]["question"])
    assert isinstance(response, StreamingAgentChatResponse)

    assert tracker.active_runs == 1  # nothing decoded yet: the run's nodes wait for the answer

    # Decoded in LlamaIndex's thread, in a span under `stream_chat`'s, which has exited.
    assert "".join(response.response_gen).strip()
    nodes = response.source_nodes
    del response
    assert_run_released(llm, calls, nodes, before)


def test_async_streaming_chat(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    before = llm.engine.trie.owners()

    async def turn() -> tuple[str, Any]:
        chat_engine = index.as_chat_engine(chat_mode="context", llm=llm, similarity_top_k=TOP_K)
        response = await chat_engine.astream_chat(records[1]["question"])
        text = "".join([token async for token in response.async_response_gen()])
        return text, response.source_nodes

    text, nodes = asyncio.run(turn())
    assert text.strip()
    assert_run_released(llm, calls, nodes, before)


def test_concurrent_async_turns_each_see_their_own_nodes(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    questions = [records[1]["question"], records[2]["question"]]

    async def both() -> list[Any]:
        engines = [
            index.as_chat_engine(chat_mode="context", llm=llm, similarity_top_k=TOP_K) for _ in questions
        ]
        return await asyncio.gather(*(e.achat(q) for e, q in zip(engines, questions, strict=True)))

    responses = asyncio.run(both())

    assert len(calls.scopes) == 2 and len(set(calls.owners())) == 2
    for response in responses:
        wanted = sorted(tokens(llm, response.source_nodes))
        (scope,) = [s for s in calls.scopes if sorted(map(list, s.sequences)) == wanted]
        assert_run_scope(llm, scope, response.source_nodes)


def test_threads_each_see_their_own_nodes(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    questions = [records[0]["question"], records[2]["question"]]
    responses: dict[int, Any] = {}

    def turn(i: int) -> None:
        chat_engine = index.as_chat_engine(chat_mode="context", llm=llm, similarity_top_k=TOP_K)
        responses[i] = chat_engine.chat(questions[i])

    threads = [threading.Thread(target=turn, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(calls.scopes) == 2 and len(set(calls.owners())) == 2
    for response in responses.values():
        wanted = sorted(tokens(llm, response.source_nodes))
        (scope,) = [s for s in calls.scopes if sorted(map(list, s.sequences)) == wanted]
        assert_run_scope(llm, scope, response.source_nodes)


class SearchArgs(BaseModel):
    query: str = Field(description="A few words to look up", max_length=40)


class FirstChoice(BaseSelector):
    """Always routes to the first query engine (the model picks nothing)."""

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass

    def _select(self, choices: Any, query: QueryBundle) -> SelectorResult:
        return SelectorResult(selections=[SingleSelection(index=0, reason="first")])

    async def _aselect(self, choices: Any, query: QueryBundle) -> SelectorResult:
        return self._select(choices, query)


def test_router_over_a_plain_retriever_query_engine(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    inner = RetrieverQueryEngine.from_args(index.as_retriever(similarity_top_k=TOP_K), llm=llm)
    tool = QueryEngineTool.from_defaults(inner, description="Facts from the Dolly contexts.")
    router = RouterQueryEngine(selector=FirstChoice(), query_engine_tools=[tool], llm=llm)

    response = router.query(records[1]["question"])

    (scope,) = calls.scopes
    assert_run_scope(llm, scope, response.source_nodes)


def test_function_agent_answers_from_the_nodes_its_tool_retrieved(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    retriever = index.as_retriever(similarity_top_k=TOP_K)
    retrieved: list[Any] = []

    async def search(query: str) -> str:
        """Search the articles."""
        retrieved.extend(await retriever.aretrieve(query))
        return "\n\n".join(n.node.get_content(metadata_mode=MetadataMode.LLM) for n in retrieved)

    tool = FunctionTool.from_defaults(async_fn=search, name="search", fn_schema=SearchArgs)
    roomy = LookaheadLLM(engine=llm.engine, max_new_tokens=48)  # room for a whole forced call
    agent = FunctionAgent(tools=[tool], llm=roomy, initial_tool_choice="search", streaming=False)

    async def run() -> Any:
        # One tool round: a second call (the small model may make one) ends the run, answered.
        handler = agent.run(
            user_msg=records[1]["question"], max_iterations=2, early_stopping_method="generate"
        )
        return await handler

    asyncio.run(run())
    # The forced call came before any retrieval; the later turns drafted from the tool's nodes.
    assert calls.scopes[0] is None and len(calls.scopes) >= 2
    assert len(set(calls.owners()[1:])) == 1  # one scope: the agent run's
    for scope in calls.scopes[1:]:
        assert_run_scope(llm, scope, retrieved)


def test_user_code_in_a_span_and_what_stays_out(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    retriever = index.as_retriever(similarity_top_k=TOP_K)
    question = records[1]["question"]

    @dispatcher.span
    def answer(question: str) -> tuple[Any, str]:
        nodes = retriever.retrieve(question)
        return nodes, str(llm.complete(question, max_new_tokens=4))

    nodes, _ = answer(question)
    (scope,) = calls.scopes
    assert_run_scope(llm, scope, nodes)

    # A retrieval with no run around it, then a call: nothing carries over.
    retriever.retrieve(question)
    llm.complete(question, max_new_tokens=4)
    untracked = LookaheadLLM(engine=llm.engine, track_retrievals=False, max_new_tokens=4)

    @dispatcher.span
    def untracked_answer(question: str) -> None:
        retriever.retrieve(question)
        untracked.complete(question)

    untracked_answer(question)
    assert calls.scopes[1:] == [None, None]


def test_an_explicit_scope_and_a_query_engines_scope_come_first(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    retriever = index.as_retriever(similarity_top_k=TOP_K)
    mine = llm.engine.scope(["A document of my own."])

    @dispatcher.span
    def answer(question: str) -> None:
        retriever.retrieve(question)
        llm.complete(question, max_new_tokens=4, scope=mine)

    answer(records[1]["question"])
    assert calls.scopes == [mine]
    mine.close()


def test_a_failed_call_releases_the_run(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], tracker: RetrievalScopes
) -> None:
    retriever = index.as_retriever(similarity_top_k=TOP_K)
    before = llm.engine.trie.owners()

    @dispatcher.span
    def answer(question: str) -> None:
        retriever.retrieve(question)
        llm.complete(question, max_new_tokens=4)
        llm.complete("bee " * 9000)  # longer than the model's context window

    with pytest.raises(ValueError, match="context window"):
        answer(records[1]["question"])
    assert not new_owners(llm, before)


def test_streaming_query_engine_response_from_a_plain_retriever_query_engine(
    index: Any, llm: LookaheadLLM, records: list[dict[str, Any]], calls: Calls, tracker: RetrievalScopes
) -> None:
    engine = RetrieverQueryEngine.from_args(
        index.as_retriever(similarity_top_k=TOP_K), llm=llm, streaming=True
    )
    before = llm.engine.trie.owners()
    response = engine.query(records[1]["question"])
    assert isinstance(response, StreamingResponse)
    assert "".join(response.response_gen).strip()
    nodes = response.source_nodes
    del response
    assert_run_released(llm, calls, nodes, before)
