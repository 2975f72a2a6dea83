"""Construction from the embedded default model and from a local model directory, offline."""

import pytest

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from rag_lookahead.models import default_model_dir
from tests.integration_tests.shared import shared_engine

pytestmark = pytest.mark.model


def test_the_embedded_default_model_loads_on_first_call() -> None:
    chat = ChatLookahead(max_tokens=8)
    assert chat._resolved is None
    reference = ChatLookahead(engine=shared_engine(), max_tokens=8).invoke("Hello").content
    assert chat.invoke("Hello").content == reference
    assert chat.get_engine() is not shared_engine()  # its own model


def test_a_local_model_directory() -> None:
    prompt = "The capital of France is"
    llm = LookaheadLLM(model=str(default_model_dir()), max_tokens=8)
    assert llm.invoke(prompt) == LookaheadLLM(engine=shared_engine(), max_tokens=8).invoke(prompt)
