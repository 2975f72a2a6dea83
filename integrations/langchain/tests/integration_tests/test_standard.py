"""LangChain's standard integration tests for `ChatLookahead`, on the real default model."""

from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_rag_lookahead import ChatLookahead
from tests.integration_tests.shared import shared_engine

pytestmark = pytest.mark.model


class TestChatLookaheadIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatLookahead]:
        return ChatLookahead

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Every test builds its own ChatLookahead; they share one loaded model and trie.
        return {"engine": shared_engine(), "max_tokens": 16}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False
