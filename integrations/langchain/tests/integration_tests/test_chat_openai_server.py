"""LangChain's own `ChatOpenAI` (langchain-openai, unmodified) pointed at `rag-lookahead serve
--backend local` on 127.0.0.1: invoke, stream, ainvoke, astream, batch and structured output
answer exactly what the in-process engine answers, greedy and seeded-sampled.

The tiny random model stands in for a real one: only the equality of answers matters here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from rag_lookahead import LookaheadEngine
from rag_lookahead.structured import Grammar
from rag_lookahead.testing.local_server import (
    LiveServer,
    recording_documents,
    served_engine,
    settled_server,
)

pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])  # the loopback server only

MODEL = "tiny"
N = 16
QUESTION = "Who were the Normans?"
DOCUMENTS = ["The Normans were the people who gave their name to Normandy, a region in France."]
SCHEMA = {
    "title": "Answer",
    "type": "object",
    "properties": {"b": {"enum": ["xy", "zw"]}, "c": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["b", "c"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    with settled_server(engine, MODEL) as server:
        yield server


def chat_openai(live: LiveServer, **kwargs: object) -> ChatOpenAI:
    """`ChatOpenAI` as its users configure it for an OpenAI-compatible server."""
    settings: dict[str, object] = {"temperature": 0, "max_tokens": N, **kwargs}
    return ChatOpenAI(base_url=f"{live.url}/v1", api_key="none", model=MODEL, max_retries=0, **settings)  # type: ignore[arg-type]


def in_process(engine: LookaheadEngine, content: str = QUESTION, **kwargs: object) -> str:
    return engine.complete([{"role": "user", "content": content}], max_new_tokens=N, **kwargs).text  # type: ignore[arg-type]


def test_invoke_and_stream_are_the_engine_s_greedy_answer(live: LiveServer, engine: LookaheadEngine) -> None:
    llm = chat_openai(live)
    expected = in_process(engine)
    assert llm.invoke(QUESTION).content == expected
    assert "".join(str(chunk.content) for chunk in llm.stream(QUESTION)) == expected


def test_usage_comes_back_streamed_and_not(live: LiveServer, engine: LookaheadEngine) -> None:
    """`stream_usage=True` sends ``stream_options``; the counts are the engine's."""
    stats = engine.complete([{"role": "user", "content": QUESTION}], max_new_tokens=N).stats
    llm = chat_openai(live, stream_usage=True)
    whole = llm.invoke(QUESTION)
    assert whole.usage_metadata is not None
    assert (whole.usage_metadata["input_tokens"], whole.usage_metadata["output_tokens"]) == (
        stats.prompt_tokens,
        stats.new_tokens,
    )
    assert whole.response_metadata["token_usage"]["lookahead"]["steps"] >= 1
    chunks = list(llm.stream(QUESTION))
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert total.usage_metadata is not None and total.usage_metadata["output_tokens"] == stats.new_tokens


def test_documents_go_in_through_extra_body(
    live: LiveServer, engine: LookaheadEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[str]] = []
    monkeypatch.setattr(engine, "stream", recording_documents(engine, sent))
    llm = chat_openai(live, extra_body={"documents": DOCUMENTS})
    answer = llm.invoke(QUESTION)
    assert sent == [DOCUMENTS]  # the server's call drafts from them
    monkeypatch.undo()
    assert answer.content == in_process(engine, documents=DOCUMENTS)


async def test_ainvoke_and_astream(live: LiveServer, engine: LookaheadEngine) -> None:
    llm = chat_openai(live)
    expected = in_process(engine)
    assert (await llm.ainvoke(QUESTION)).content == expected
    assert "".join([str(chunk.content) async for chunk in llm.astream(QUESTION)]) == expected


def test_system_messages_batch_and_stop(live: LiveServer, engine: LookaheadEngine) -> None:
    llm = chat_openai(live)
    messages = [SystemMessage("Answer briefly."), HumanMessage(QUESTION)]
    expected = engine.complete(
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
        max_new_tokens=N,
    ).text
    assert llm.invoke(messages).content == expected
    questions = [f"Question {i}: {QUESTION}" for i in range(3)]
    assert [m.content for m in llm.batch(questions)] == [in_process(engine, q) for q in questions]
    stop = in_process(engine)[3:5]  # a stop string the answer contains
    stopped = chat_openai(live, stop=[stop]).invoke(QUESTION).content
    assert stopped == in_process(engine, stop_strings=(stop,)) and len(stopped) < len(in_process(engine))


def test_a_seeded_sampled_answer_is_the_engine_s(live: LiveServer, engine: LookaheadEngine) -> None:
    llm = chat_openai(live, temperature=0.8, seed=7)
    expected = in_process(engine, do_sample=True, temperature=0.8, seed=7)
    assert llm.invoke(QUESTION).content == expected
    assert "".join(str(chunk.content) for chunk in llm.stream(QUESTION)) == expected


def test_structured_output_is_the_constrained_answer(live: LiveServer, engine: LookaheadEngine) -> None:
    """``with_structured_output(method="json_schema")`` sends ``response_format``; the server
    constrains the answer by grammar as the engine does in process."""
    llm = chat_openai(live, max_tokens=64).with_structured_output(SCHEMA, method="json_schema")
    expected = engine.complete(
        [{"role": "user", "content": QUESTION}], max_new_tokens=64, grammar=Grammar.json_schema(SCHEMA)
    ).text
    assert llm.invoke(QUESTION) == json.loads(expected)


def test_logprobs_read_as_chat_lookahead_reports_them(live: LiveServer, engine: LookaheadEngine) -> None:
    """ChatOpenAI's `response_metadata["logprobs"]` over HTTP is what `ChatLookahead` gives."""
    from langchain_rag_lookahead import ChatLookahead

    local = ChatLookahead(engine=engine, max_tokens=N, logprobs=True, top_logprobs=2)
    want = local.invoke(QUESTION).response_metadata["logprobs"]["content"]
    llm = chat_openai(live, logprobs=True, top_logprobs=2)
    got = llm.invoke(QUESTION).response_metadata["logprobs"]["content"]
    merged = None
    for chunk in llm.stream(QUESTION):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    streamed = merged.response_metadata["logprobs"]["content"]
    for entries in (got, streamed):
        assert [e["token"] for e in entries] == [w["token"] for w in want]
        assert [e["bytes"] for e in entries] == [w["bytes"] for w in want]
        assert [e["logprob"] for e in entries] == pytest.approx([w["logprob"] for w in want], abs=1e-4)
        assert [[t["token"] for t in e["top_logprobs"]] for e in entries] == [
            [t["token"] for t in w["top_logprobs"]] for w in want
        ]
