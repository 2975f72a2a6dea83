"""LangChain's standard integration tests for `ChatLookahead`, on the real default model."""

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_tests.integration_tests import ChatModelIntegrationTests

from tests.capabilities import LocalChatModelCapabilities
from tests.integration_tests.shared import shared_engine

pytestmark = pytest.mark.model


class TestChatLookaheadIntegration(LocalChatModelCapabilities, ChatModelIntegrationTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Every test builds its own ChatLookahead; they share one loaded model and trie. Enough
        # tokens for a forced tool call or a short structured answer to close; greedy, the
        # 135M model repeats itself inside a JSON string until the tokens run out.
        return {"engine": shared_engine(), "max_tokens": 64, "repetition_penalty": 1.2}

    # The suite leaves these two calls unforced, and a 135M model does not call tools on its own;
    # the same flows with the call forced are the two tests after them.
    @pytest.mark.xfail(reason="the 135M default model does not call tools unforced")
    def test_unicode_tool_call_integration(self, model: BaseChatModel) -> None:  # type: ignore[override]
        super().test_unicode_tool_call_integration(model)

    @pytest.mark.xfail(reason="the 135M default model does not call tools unforced")
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    def test_unicode_tool_call_forced(self, model: BaseChatModel) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice="any")

    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop_forced(self, model: BaseChatModel) -> None:
        """The suite's agent loop with the call turn forced: the call, the tool's result as a
        ToolMessage, then an answer."""

        @tool
        def get_weather(location: str) -> str:
            """Get the weather at a location."""
            return "It's sunny."

        question = HumanMessage("What is the weather in San Francisco, CA?")
        call = model.bind_tools([get_weather], tool_choice="any").invoke([question])
        assert isinstance(call, AIMessage)
        assert any(block["type"] == "tool_call" for block in call.content_blocks)
        assert len(call.tool_calls) == 1
        result = get_weather.invoke(call.tool_calls[0])
        assert isinstance(result, ToolMessage)
        answer = model.bind_tools([get_weather]).invoke([question, call, result])
        assert isinstance(answer, AIMessage)
