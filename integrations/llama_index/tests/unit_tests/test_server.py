"""`LookaheadLLM` and `LookaheadQueryEngine` on a server engine (a loopback stub of an OpenAI API)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from llama_index.llms.rag_lookahead import LookaheadLLM, LookaheadQueryEngine
from rag_lookahead.remote import ServerEngine
from rag_lookahead.testing.stub_server import Answer, StubServer


def server_llm(stub: StubServer, kind: Any = "vllm", **kwargs: Any) -> LookaheadLLM:
    engine = ServerEngine(stub.base_url, "served-model", kind, max_retries=0, context_window=4096)
    return LookaheadLLM(engine=engine, max_new_tokens=16, **kwargs)


def test_llm_metadata_and_calls(stub: StubServer) -> None:
    llm = server_llm(stub, stop=["###"])
    assert llm.metadata.model_name == "served-model" and llm.metadata.is_chat_model
    assert llm.metadata.context_window == 4096
    stub.reply(Answer(("Blue", "."), usage=(11, 2)))
    response = llm.chat([ChatMessage(role=MessageRole.USER, content="Sky colour?")])
    assert response.message.content == "Blue."
    body = stub.completions()[-1].body
    assert body["messages"] == [{"role": "user", "content": "Sky colour?"}]
    assert (body["max_tokens"], body["stop"]) == (16, ["###"])
    assert "".join(r.delta or "" for r in llm.stream_complete("Sky colour?")) == "Hello, world"
    assert asyncio.run(llm.acomplete("Sky colour?")).text == "Hello, world"


def test_lookahead_off_needs_a_second_server(stub: StubServer) -> None:
    llm = server_llm(stub, lookahead=False)
    with pytest.raises(ValueError, match="second server"):
        llm.complete("x")


def test_query_engine_loads_the_retrieved_nodes_into_sglang(stub: StubServer, index: Any) -> None:
    llm = server_llm(stub, "sglang")
    engine = LookaheadQueryEngine.from_index(index, llm=llm, similarity_top_k=3)
    response = engine.query("What is the capital of France?")
    assert str(response) == "Hello, world"
    adds = [r.body for r in stub.requests if r.path == "/add_external_corpus"]
    assert len(adds) == 1 and len(adds[0]["documents"]) == 3
    removes = [r.body["corpus_id"] for r in stub.requests if r.path == "/remove_external_corpus"]
    assert removes == [adds[0]["corpus_id"]] and stub.corpora == {}


def test_query_engine_on_vllm_sends_the_prompt_alone(stub: StubServer, index: Any) -> None:
    engine = LookaheadQueryEngine.from_index(index, llm=server_llm(stub, "vllm"), similarity_top_k=3)
    assert str(engine.query("What is the capital of France?")) == "Hello, world"
    assert not [r for r in stub.requests if "corpus" in r.path]


def test_base_url_answers_on_that_server(stub: StubServer) -> None:
    llm = LookaheadLLM(
        base_url=stub.base_url,
        model="served-model",
        server_kind="vllm",
        api_key="k",
        max_retries=0,
        timeout=5,
    )
    engine = llm.engine
    assert isinstance(engine, ServerEngine) and llm.metadata.model_name == "served-model"
    assert (engine.config.kind, engine.config.api_key, engine.config.max_retries) == ("vllm", "k", 0)
    assert engine.config.timeout == 5
    stub.reply(Answer(("Blue", "."), usage=(11, 2)))
    assert llm.chat([ChatMessage(role=MessageRole.USER, content="Sky colour?")]).message.content == "Blue."
    assert stub.completions()[-1].body["model"] == "served-model"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"base_url": "http://127.0.0.1:9/v1"}, "served model"),
        ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "device": "cpu"}, "local model"),
        ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "engine": object()}, "either"),
        ({"model": "m", "model_name": "n"}, "either `model`"),
        ({"api_key": "k"}, "base_url"),
        ({"server_kind": "sglang"}, "base_url"),
    ],
)
def test_bad_server_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LookaheadLLM(**settings)
