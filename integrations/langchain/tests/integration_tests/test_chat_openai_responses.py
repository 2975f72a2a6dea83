"""LangChain's own `ChatOpenAI` with ``use_responses_api=True`` (what it uses for OpenAI's newer
models) pointed at `rag-lookahead serve --backend local` on 127.0.0.1: its Responses requests
are answered as the in-process engine answers the same messages.

The tiny random model stands in for a real one: only the equality of answers matters here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from rag_lookahead import LookaheadEngine
from rag_lookahead.testing.local_server import LiveServer, served_engine, settled_server

pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])  # the loopback server only

MODEL = "tiny"
N = 16
QUESTION = "Who were the Normans?"
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


def responses_llm(live: LiveServer, **kwargs: object) -> ChatOpenAI:
    settings: dict[str, object] = {"temperature": 0, "max_tokens": N, **kwargs}
    return ChatOpenAI(
        base_url=f"{live.url}/v1",
        api_key="none",
        model=MODEL,
        max_retries=0,
        use_responses_api=True,
        **settings,
    )


def test_invoke_and_stream_are_the_engine_s_greedy_answer(live: LiveServer, engine: LookaheadEngine) -> None:
    messages = [SystemMessage("Be brief."), HumanMessage(QUESTION)]
    expected = engine.complete(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}], max_new_tokens=N
    )
    llm = responses_llm(live)
    answer = llm.invoke(messages)
    assert answer.text == expected.text
    assert answer.response_metadata["id"].startswith("resp_")
    assert (
        answer.usage_metadata is not None
        and answer.usage_metadata["output_tokens"] == expected.stats.new_tokens
    )
    streamed = list(llm.stream(messages))
    assert "".join(chunk.text for chunk in streamed) == expected.text


def test_structured_output_is_the_constrained_answer(live: LiveServer) -> None:
    llm = responses_llm(live, max_tokens=64).with_structured_output(SCHEMA, method="json_schema")
    value = llm.invoke(QUESTION)
    assert isinstance(value, dict) and value["b"] in ("xy", "zw") and 0 <= value["c"] <= 99
