"""``logprobs=True`` as LlamaIndex's OpenAI LLM reports it: a response's ``logprobs``, one list
of `LogProb` per token (its position's most likely tokens), cumulative like its text."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import LogProb
from llama_index.core.llms import ChatMessage, MessageRole

from llama_index.llms.rag_lookahead import LookaheadLLM
from rag_lookahead import LookaheadEngine

N = 12
QUESTION = "Where is the lighthouse?"
MESSAGES = [{"role": "user", "content": QUESTION}]


pytestmark = pytest.mark.usefixtures("one_thread")


def expected(engine: LookaheadEngine, top: int) -> list[list[tuple[str, float]]]:
    completion = engine.plain().complete(MESSAGES, max_new_tokens=N, logprobs=True, top_logprobs=top)
    assert completion.logprobs is not None
    return [[(t.token, t.logprob) for t in (item.top_logprobs or (item,))] for item in completion.logprobs]


def pairs(logprobs: list[list[LogProb]] | None) -> list[list[tuple[str, float]]]:
    assert logprobs is not None
    return [[(p.token, p.logprob) for p in position] for position in logprobs]


def close(got: list[list[tuple[str, float]]], want: list[list[tuple[str, float]]]) -> None:
    assert [[t for t, _ in p] for p in got] == [[t for t, _ in p] for p in want]
    for a, b in zip(got, want, strict=True):
        assert [v for _, v in a] == pytest.approx([v for _, v in b], abs=1e-4)


def test_chat_and_complete_report_them(engine: LookaheadEngine) -> None:
    llm = LookaheadLLM(engine=engine, max_new_tokens=N, logprobs=True, top_logprobs=2)
    close(
        pairs(llm.chat([ChatMessage(role=MessageRole.USER, content=QUESTION)]).logprobs), expected(engine, 2)
    )
    close(pairs(llm.complete(QUESTION).logprobs), expected(engine, 2))
    assert LookaheadLLM(engine=engine, max_new_tokens=4).complete(QUESTION).logprobs is None


def test_a_call_asks_for_them_and_streamed_responses_grow_with_the_text(engine: LookaheadEngine) -> None:
    llm = LookaheadLLM(engine=engine, max_new_tokens=N)
    responses = list(llm.stream_complete(QUESTION, logprobs=True))
    counts = [len(r.logprobs or ()) for r in responses]
    assert counts == sorted(counts) and counts[-1] == N
    close(pairs(responses[-1].logprobs), expected(engine, 0))  # the token itself, top_logprobs=0
    final = asyncio.run(llm.acomplete(QUESTION, logprobs=True, top_logprobs=1))
    close(pairs(final.logprobs), expected(engine, 1))


def test_bad_values_are_refused(engine: LookaheadEngine) -> None:
    with pytest.raises(ValueError):
        LookaheadLLM(engine=engine, top_logprobs=21)
    llm = LookaheadLLM(engine=engine, max_new_tokens=N)
    with pytest.raises(ValueError, match="top_logprobs needs logprobs"):
        llm.complete(QUESTION, top_logprobs=3)
    with pytest.raises(ValueError, match="top_logprobs must be from 0 to 20"):
        llm.complete(QUESTION, logprobs=True, top_logprobs=-1)
