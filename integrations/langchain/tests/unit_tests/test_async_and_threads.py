"""Async calls work off the event loop and cancel cleanly; batch workers share one model."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from rag_lookahead import LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.streaming import aiterate

N = 40
QUESTIONS = [f"Question number {i}: where is lighthouse {i}?" for i in range(6)]


class SlowStream:
    """Wraps an engine stream: each piece takes ``delay`` seconds; records the worker thread."""

    def __init__(self, inner: Any, delay: float, log: dict[str, Any]) -> None:
        self.inner, self.delay, self.log = inner, delay, log
        log["thread"] = threading.current_thread().name

    def __enter__(self) -> SlowStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()
        self.log["closed"] = True

    def __iter__(self) -> Iterator[str]:
        for piece in self.inner:
            time.sleep(self.delay)
            yield piece

    def chunks(self) -> Iterator[Any]:
        for chunk in self.inner.chunks():
            time.sleep(self.delay)
            yield chunk

    @property
    def stats(self) -> Any:
        return self.inner.stats


def slow_down(engine: LookaheadEngine, delay: float) -> dict[str, Any]:
    log: dict[str, Any] = {}
    real = engine.stream
    engine.stream = lambda *a, **k: SlowStream(real(*a, **k), delay, log)  # type: ignore[method-assign]
    return log


async def test_ainvoke_and_astream_match_invoke(engine) -> None:
    chat = ChatLookahead(engine=engine, max_tokens=N)
    expected = chat.invoke(QUESTIONS[0]).content
    assert (await chat.ainvoke(QUESTIONS[0])).content == expected
    assert "".join([c.content async for c in chat.astream(QUESTIONS[0])]) == expected

    llm = LookaheadLLM(engine=engine, max_tokens=N)
    text = llm.invoke(QUESTIONS[0])
    assert await llm.ainvoke(QUESTIONS[0]) == text
    assert "".join([c async for c in llm.astream(QUESTIONS[0])]) == text


async def test_generation_runs_in_a_worker_thread_and_the_loop_stays_free(engine) -> None:
    log = slow_down(engine, delay=0.02)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    task = asyncio.create_task(ticker())
    chunks = [c async for c in ChatLookahead(engine=engine, max_tokens=12).astream(QUESTIONS[0])]
    task.cancel()
    assert log["thread"] == "rag-lookahead"
    # A blocked loop would tick about once per chunk; a free one every couple of milliseconds.
    assert ticks > 3 * len(chunks)


async def test_cancelling_astream_closes_the_engine_stream(engine) -> None:
    log = slow_down(engine, delay=0.05)
    chat = ChatLookahead(engine=engine, max_tokens=200)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in chat.astream(QUESTIONS[0], documents=["a retrieved passage"]):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):  # the worker stops after its current step
        if log.get("closed"):
            break
        await asyncio.sleep(0.02)
    assert log.get("closed")
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # the call's branches are gone


async def test_worker_errors_reach_the_consumer() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise RuntimeError("boom")

    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        async for item in aiterate(failing()):
            seen.append(item)
    assert seen == [1]


@pytest.mark.parametrize("cls", [ChatLookahead, LookaheadLLM])
def test_batch_with_several_workers_matches_one_by_one(cls: type, engine) -> None:
    model = cls(engine=engine, max_tokens=N)
    text = (lambda m: m.content) if cls is ChatLookahead else (lambda t: t)
    alone = [text(model.invoke(q)) for q in QUESTIONS]
    threads: set[str] = set()
    real = engine.stream

    def stream(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    engine.stream = stream  # type: ignore[method-assign]
    together = model.batch(QUESTIONS, config={"max_concurrency": 3})
    assert [text(result) for result in together] == alone
    assert len(threads) > 1  # really several workers on the one model
    assert engine.trie.owners() <= {OUTPUT_OWNER}


async def test_abatch_matches_one_by_one(engine) -> None:
    chat = ChatLookahead(engine=engine, max_tokens=N)
    alone = [chat.invoke(q).content for q in QUESTIONS[:3]]
    together = await chat.abatch(QUESTIONS[:3], config={"max_concurrency": 3})
    assert [m.content for m in together] == alone
