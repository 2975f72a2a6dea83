"""Predicted Outputs through `LookaheadLLM`: a prediction (the LLM's setting or a call's, as a
string or OpenAI's shape) drafts first and changes no token."""

from __future__ import annotations

from llama_index.core.llms import ChatMessage, MessageRole

from llama_index.llms.rag_lookahead import LookaheadLLM
from rag_lookahead import LookaheadEngine

N = 40
QUESTION = "Where is the lighthouse?"


def test_a_prediction_drafts_and_changes_nothing(engine: LookaheadEngine) -> None:
    messages = [{"role": "user", "content": QUESTION}]
    reference = engine.plain().complete(messages, max_new_tokens=N).text
    chat = [ChatMessage(role=MessageRole.USER, content=QUESTION)]
    response = LookaheadLLM(engine, max_new_tokens=N, prediction=reference).chat(chat)
    assert response.message.content == reference
    assert response.additional_kwargs["lookahead"]["accepted_prediction_tokens"] >= N // 2
    # A call's own prediction, in OpenAI's shape, replaces the LLM's (here a wrong one).
    llm = LookaheadLLM(engine, max_new_tokens=N, prediction="~~~~ nothing like it ~~~~")
    called = llm.complete(QUESTION, prediction={"type": "content", "content": reference})
    assert called.text == reference
    assert called.additional_kwargs["completion_tokens_details"]["accepted_prediction_tokens"] >= N // 2
