"""LlamaIndex's own `OpenAILike` (llama-index-llms-openai-like, unmodified) pointed at
`rag-lookahead serve --backend local` on 127.0.0.1: chat, complete, their streams and their
async forms answer exactly what the in-process engine answers, greedy and seeded-sampled.

The tiny random model stands in for a real one: only the equality of answers matters here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from rag_lookahead import LookaheadEngine
from rag_lookahead.testing.local_server import (
    LiveServer,
    recording_documents,
    served_engine,
    settled_server,
)

# A server on 127.0.0.1 only: sockets stay off for every other host.
pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])

MODEL = "tiny"
N = 16
QUESTION = "Who were the Normans?"
PROMPT = "The Normans were"
DOCUMENTS = ["The Normans were the people who gave their name to Normandy, a region in France."]
MESSAGES = [ChatMessage(role="user", content=QUESTION)]


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    with settled_server(engine, MODEL) as server:
        yield server


def openai_like(live: LiveServer, **kwargs: object) -> OpenAILike:
    """`OpenAILike` as its users configure it for an OpenAI-compatible server."""
    settings: dict[str, object] = {"temperature": 0, "max_tokens": N, "is_chat_model": True, **kwargs}
    return OpenAILike(model=MODEL, api_base=f"{live.url}/v1", api_key="none", max_retries=0, **settings)


def chat_answer(engine: LookaheadEngine, **kwargs: object) -> str:
    return engine.complete([{"role": "user", "content": QUESTION}], max_new_tokens=N, **kwargs).text  # type: ignore[arg-type]


def test_chat_and_stream_chat_are_the_greedy_answer(live: LiveServer, engine: LookaheadEngine) -> None:
    llm = openai_like(live)
    expected = chat_answer(engine)
    assert llm.chat(MESSAGES).message.content == expected
    assert "".join(r.delta or "" for r in llm.stream_chat(MESSAGES)) == expected
    assert llm.complete(QUESTION).text == expected  # a chat model completes through /v1/chat/completions


def test_complete_on_a_completion_model(live: LiveServer, engine: LookaheadEngine) -> None:
    """``is_chat_model=False``: ``complete`` goes to ``/v1/completions`` with the bare prompt."""
    llm = openai_like(live, is_chat_model=False)
    expected = engine.complete(PROMPT, max_new_tokens=N).text
    assert llm.complete(PROMPT).text == expected
    assert "".join(r.delta or "" for r in llm.stream_complete(PROMPT)) == expected


async def _async_answers(llm: OpenAILike) -> list[str]:
    chat = (await llm.achat(MESSAGES)).message.content or ""
    streamed = "".join([r.delta or "" async for r in await llm.astream_chat(MESSAGES)])
    completed = (await llm.acomplete(QUESTION)).text
    return [chat, streamed, completed]


def test_the_async_forms(live: LiveServer, engine: LookaheadEngine) -> None:
    assert asyncio.run(_async_answers(openai_like(live))) == [chat_answer(engine)] * 3


def test_documents_go_in_through_additional_kwargs(
    live: LiveServer, engine: LookaheadEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[str]] = []
    monkeypatch.setattr(engine, "stream", recording_documents(engine, sent))
    llm = openai_like(live, additional_kwargs={"extra_body": {"documents": DOCUMENTS}})
    answer = llm.chat(MESSAGES)
    assert sent == [DOCUMENTS]  # the server's call drafts from them
    monkeypatch.undo()
    assert answer.message.content == chat_answer(engine, documents=DOCUMENTS)


def test_a_seeded_sampled_answer_is_the_engine_s(live: LiveServer, engine: LookaheadEngine) -> None:
    llm = openai_like(live, temperature=0.8, additional_kwargs={"seed": 7})
    expected = chat_answer(engine, do_sample=True, temperature=0.8, seed=7)
    assert llm.chat(MESSAGES).message.content == expected
    assert "".join(r.delta or "" for r in llm.stream_chat(MESSAGES)) == expected


def test_logprobs_read_as_lookahead_llm_reports_them(live: LiveServer, engine: LookaheadEngine) -> None:
    """OpenAILike's `logprobs` over HTTP are what `LookaheadLLM` gives in process."""
    from llama_index.llms.rag_lookahead import LookaheadLLM

    local = LookaheadLLM(engine=engine, max_new_tokens=N, logprobs=True, top_logprobs=2).chat(MESSAGES)
    remote = openai_like(live, logprobs=True, top_logprobs=2).chat(MESSAGES)
    assert local.logprobs is not None and remote.logprobs is not None
    assert [[p.token for p in position] for position in remote.logprobs] == [
        [p.token for p in position] for position in local.logprobs
    ]
    got = [p.logprob for position in remote.logprobs for p in position]
    assert got == pytest.approx([p.logprob for position in local.logprobs for p in position], abs=1e-4)
