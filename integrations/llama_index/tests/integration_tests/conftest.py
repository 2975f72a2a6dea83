"""The real model: the embedded default model, loaded once for the whole session, offline."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llama_index.llms.rag_lookahead import LookaheadLLM
from tests.integration_tests.shared import MAX_NEW_TOKENS, CallSpy


@pytest.fixture(scope="session")
def llm() -> LookaheadLLM:
    """The default model, loaded with no arguments, as users would."""
    return LookaheadLLM(max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def plain_llm(llm: LookaheadLLM) -> LookaheadLLM:
    """The same model and engine with lookahead off: the reference output."""
    return LookaheadLLM(engine=llm.engine, lookahead=False, max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture
def spy(llm: LookaheadLLM) -> Iterator[CallSpy]:
    """Records, at the start of every LLM call, the active query scope and its trie nodes."""
    import llama_index.core.instrumentation as instrument
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.llm import (
        LLMChatStartEvent,
        LLMCompletionStartEvent,
    )

    spy = CallSpy(llm)

    class Handler(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            if isinstance(event, (LLMChatStartEvent, LLMCompletionStartEvent)):
                spy.record()

    dispatcher = instrument.get_dispatcher()
    handler = Handler()
    dispatcher.add_event_handler(handler)
    try:
        yield spy
    finally:
        dispatcher.event_handlers.remove(handler)
