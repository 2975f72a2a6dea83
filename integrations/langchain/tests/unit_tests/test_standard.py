"""LangChain's standard unit tests for `ChatLookahead`."""

from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from tests.capabilities import LocalChatModelCapabilities


class TestChatLookaheadUnit(LocalChatModelCapabilities, ChatModelUnitTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # The embedded default model: construction is cheap, the model loads on first call.
        # The suite's default parameters (api_key, timeout, max_retries) apply as they are.
        return {"lookahead": True}
