"""`ChatLookahead` and `LookaheadLLM` driving a server (a loopback stub of an OpenAI API)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import ValidationError

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from rag_lookahead.remote import ServerEngine
from rag_lookahead.testing.stub_server import Answer, StubServer, stub_server
from tests.capabilities import LocalChatModelCapabilities

SERVER = "http://127.0.0.1:9/v1"  # never reached by construction-only tests


class TestChatLookaheadServerUnit(LocalChatModelCapabilities, ChatModelUnitTests):
    """LangChain's standard parameters (timeout, max_retries, api_key...) on a server."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"base_url": SERVER, "model": "served-model", "server_kind": "vllm"}


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with stub_server() as server:
        yield server


def test_server_settings_build_a_server_engine() -> None:
    llm = ChatLookahead(
        base_url=SERVER, model="m", api_key="s3cret-key", timeout=5, max_retries=1, server_kind="sglang"
    )
    engine = llm.get_engine()
    assert isinstance(engine, ServerEngine)
    assert (engine.config.kind, engine.config.timeout, engine.config.max_retries) == ("sglang", 5, 1)
    assert engine.config.api_key == "s3cret-key" and "s3cret" not in repr(llm)
    assert llm.model_name == "m" and llm._identifying_params["base_url"] == SERVER


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"server_kind": "vllm"}, "base_url"),
        ({"base_url": SERVER}, "served model"),
        ({"base_url": SERVER, "model": "m", "device": "cuda"}, "local model"),
        ({"base_url": SERVER, "model": "m", "lookahead": False}, "lookahead=False"),
        ({"base_url": SERVER, "model": "m", "engine": ServerEngine(SERVER, "m")}, "either"),
        ({"base_url": SERVER, "model": "m", "server_kind": "tgi"}, "server_kind"),
        ({"base_url": SERVER, "model": "m", "timeout": 0}, "timeout"),
        ({"base_url": SERVER, "model": "m", "max_retries": -1}, "max_retries"),
    ],
)
def test_bad_server_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ChatLookahead(**settings)


@pytest.mark.enable_socket
def test_chat_on_a_server(stub: StubServer) -> None:
    llm = ChatLookahead(base_url=stub.base_url, model="m", server_kind="vllm", max_retries=0, max_tokens=9)
    stub.reply(Answer(("The ", "answer."), stop_reason="###", usage=(12, 3)))
    message = llm.invoke([HumanMessage("Question?")], stop=["###"])
    assert isinstance(message, AIMessage) and message.content == "The answer."
    assert message.usage_metadata == {
        "input_tokens": 12,
        "output_tokens": 3,
        "total_tokens": 15,
        "input_token_details": {"cache_read": 0},
    }
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.response_metadata["lookahead"]["finish_reason"] == "stop_string"
    body = stub.completions()[-1].body
    assert body["messages"] == [{"role": "user", "content": "Question?"}]
    assert (body["max_tokens"], body["stop"], body["temperature"]) == (9, ["###"], 0.0)
    assert "".join(c.text for c in llm.stream("Again?")) == "Hello, world"


@pytest.mark.enable_socket
def test_completion_model_and_documents_on_servers(stub: StubServer) -> None:
    vllm = LookaheadLLM(engine=ServerEngine(stub.base_url, "m", "vllm", max_retries=0))
    assert vllm.invoke("Context: blue sky.", documents=["blue sky."]) == "Hello, world"
    assert stub.completions()[-1].body["prompt"] == "Context: blue sky."
    with pytest.raises(ValueError, match="not in the prompt"):
        vllm.invoke("Context: blue sky.", documents=["green grass."])
    sglang = ChatLookahead(engine=ServerEngine(stub.base_url, "m", "sglang", max_retries=0))
    sglang.invoke("Question?", documents=["green grass."])
    adds = [r.body["documents"] for r in stub.requests if r.path == "/add_external_corpus"]
    assert adds == [["green grass."]]
    assert stub.corpora == {}


@pytest.mark.enable_socket
async def test_async_on_a_server(stub: StubServer) -> None:
    llm = ChatLookahead(base_url=stub.base_url, model="m", max_retries=0)
    chunks = [chunk.text async for chunk in llm.astream("Question?")]
    assert "".join(chunks) == "Hello, world"
