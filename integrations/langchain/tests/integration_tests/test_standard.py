"""LangChain's standard integration tests for `ChatLookahead`, on the real default model."""

from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from tests.capabilities import LocalChatModelCapabilities
from tests.integration_tests.shared import shared_engine

pytestmark = pytest.mark.model


class TestChatLookaheadIntegration(LocalChatModelCapabilities, ChatModelIntegrationTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Every test builds its own ChatLookahead; they share one loaded model and trie.
        return {"engine": shared_engine(), "max_tokens": 16}
