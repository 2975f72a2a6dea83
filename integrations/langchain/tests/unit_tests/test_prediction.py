"""Predicted Outputs through `ChatLookahead` and `LookaheadLLM`: a prediction (the model's
setting or a call's, as a string or OpenAI's shape) drafts first and changes no token."""

from __future__ import annotations

import pytest

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from rag_lookahead import LookaheadEngine
from rag_lookahead.protocol import RequestError
from tests.unit_tests.test_generation import QUESTION, chat_prompt, plain

N = 40


def test_a_chat_model_s_prediction_drafts_and_changes_nothing(engine: LookaheadEngine) -> None:
    reference = plain(engine, chat_prompt())
    result = ChatLookahead(engine=engine, max_tokens=N, prediction=reference).invoke(QUESTION)
    assert result.content == reference
    assert result.response_metadata["lookahead"]["accepted_prediction_tokens"] >= N // 2
    # A call's own prediction, in OpenAI's shape, replaces the model's (here a wrong one).
    llm = ChatLookahead(engine=engine, max_tokens=N, prediction="~~~~ nothing like it ~~~~")
    called = llm.invoke(QUESTION, prediction={"type": "content", "content": reference})
    assert called.content == reference
    assert called.response_metadata["lookahead"]["accepted_prediction_tokens"] >= N // 2


def test_a_completion_model_takes_a_prediction_per_call(engine: LookaheadEngine) -> None:
    reference = plain(engine, QUESTION)
    llm = LookaheadLLM(engine=engine, max_tokens=N)
    assert llm.invoke(QUESTION, prediction=reference) == reference


def test_a_bad_prediction_is_refused_naming_it(engine: LookaheadEngine) -> None:
    with pytest.raises(RequestError, match="prediction"):
        ChatLookahead(engine=engine, max_tokens=N).invoke(QUESTION, prediction={"type": "text"})
