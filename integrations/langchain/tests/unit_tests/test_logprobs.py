"""``logprobs=True`` as ChatOpenAI reports it: ``response_metadata["logprobs"]["content"]``,
one entry per token of the answer, on the whole message and split over streamed chunks."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from langchain_rag_lookahead.chat_models import to_chat_messages
from rag_lookahead import LookaheadEngine

N = 16
QUESTION = "Where is the lighthouse?"


def expected(engine: LookaheadEngine, prompt: object, top: int) -> list[dict[str, object]]:
    completion = engine.plain().complete(prompt, max_new_tokens=N, logprobs=True, top_logprobs=top)
    assert completion.logprobs is not None
    return [item.to_openai() for item in completion.logprobs]


def test_invoke_reports_them_in_the_response_metadata(engine: LookaheadEngine) -> None:
    want = expected(engine, to_chat_messages([HumanMessage(QUESTION)]), 2)
    message = ChatLookahead(engine=engine, max_tokens=N, logprobs=True, top_logprobs=2).invoke(QUESTION)
    content = message.response_metadata["logprobs"]["content"]
    assert [c["token"] for c in content] == [w["token"] for w in want]
    for got, item in zip(content, want, strict=True):
        assert got["logprob"] == pytest.approx(item["logprob"], abs=1e-4)
        assert [t["token"] for t in got["top_logprobs"]] == [t["token"] for t in item["top_logprobs"]]  # type: ignore[union-attr]
    assert "logprobs" not in ChatLookahead(engine=engine, max_tokens=4).invoke(QUESTION).response_metadata


def test_a_call_option_asks_for_them_and_chunks_carry_theirs(engine: LookaheadEngine) -> None:
    llm = ChatLookahead(engine=engine, max_tokens=N)
    chunks = list(llm.stream(QUESTION, logprobs=True))
    tokens = [
        c["token"] for chunk in chunks for c in chunk.response_metadata.get("logprobs", {}).get("content", [])
    ]
    assert "".join(tokens) == "".join(str(chunk.content) for chunk in chunks) and len(tokens) == N
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert isinstance(merged, AIMessageChunk)
    assert [c["token"] for c in merged.response_metadata["logprobs"]["content"]] == tokens


def test_bad_values_are_refused(engine: LookaheadEngine) -> None:
    with pytest.raises(ValueError):
        ChatLookahead(engine=engine, top_logprobs=21)
    with pytest.raises(ValueError, match="top_logprobs needs logprobs"):
        ChatLookahead(engine=engine, top_logprobs=2).invoke(QUESTION)
    with pytest.raises(ValueError, match="logprobs is true or false"):
        ChatLookahead(engine=engine).invoke(QUESTION, logprobs=3)


def test_the_completion_model_reports_the_legacy_shape(engine: LookaheadEngine) -> None:
    want = expected(engine, QUESTION, 1)
    result = LookaheadLLM(engine=engine, max_tokens=N).generate([QUESTION], logprobs=1)
    logprobs = result.generations[0][0].generation_info["logprobs"]  # type: ignore[index]
    assert logprobs["tokens"] == [w["token"] for w in want]
    assert logprobs["token_logprobs"] == pytest.approx([w["logprob"] for w in want], abs=1e-4)
    assert logprobs["text_offset"][0] == 0 and len(logprobs["top_logprobs"]) == N
