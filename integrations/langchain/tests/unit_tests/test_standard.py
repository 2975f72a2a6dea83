"""LangChain's standard unit tests for `ChatLookahead`."""

from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from tests.capabilities import LocalChatModelCapabilities


class TestChatLookaheadUnit(LocalChatModelCapabilities, ChatModelUnitTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # The embedded default model: construction is cheap, the model loads on first call.
        return {"lookahead": True}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # A local model has no API key, request timeout or retries: they need `base_url` (see test_server).
        return {"temperature": 0, "max_tokens": 100, "stop": []}
