"""`close()` from any thread, and `aclose()` from another task, while a reader is mid-step.

A web handler's disconnect closes a stream that another thread (or task) is reading: the call
must end at the next step boundary, release its trie branches, and the reader's loop must end
cleanly — what was decided, then the end of the iteration — never with an error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.streaming.stream import TextStream
from rag_lookahead.testing import CharTokenizer, tiny_model

PROMPT = [3, 14, 15, 9, 26]
DOCUMENT = "一丁七万丈三上下"
N = 300  # far more than the steps a close lets through
_WAIT = 30.0  # a bound for a test that would otherwise hang, never a measurement


def blocked_engine() -> tuple[LookaheadEngine, Callable[[TextStream], None], threading.Event]:
    """An engine whose fourth forward waits, inside the reader's step, until the stream given
    to ``watch`` is closed; the event is set once a forward waits."""
    engine = LookaheadEngine(
        tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1)
    )
    forward, watched, calls, waiting = engine.runner.forward, [], [0], threading.Event()

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 4:
            waiting.set()
            deadline = time.monotonic() + _WAIT
            while not watched[0]._closed and time.monotonic() < deadline:
                time.sleep(0.001)
        return forward(*args, **kwargs)

    engine.runner.forward = slow_forward  # type: ignore[method-assign]
    return engine, watched.append, waiting


def assert_ended_cleanly(
    engine: LookaheadEngine, stream: TextStream, read: list[Any], errors: list[Any]
) -> None:
    assert not errors, errors
    assert read  # what was decided came through
    assert stream.stats.finish_reason == "abandoned"
    assert len(stream.token_ids) < N // 3
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # released by the time close returned


def read_in_thread(items: Iterator[Any]) -> tuple[threading.Thread, list[Any], list[Any]]:
    read: list[Any] = []
    errors: list[Any] = []

    def consume() -> None:
        try:
            for item in items:
                read.append(item)
        except Exception as err:
            errors.append(err)

    thread = threading.Thread(target=consume)
    thread.start()
    return thread, read, errors


def close_while_reading(items: Callable[[TextStream], Iterator[Any]]) -> None:
    engine, watch, waiting = blocked_engine()
    stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
    watch(stream)
    thread, read, errors = read_in_thread(items(stream))
    assert waiting.wait(_WAIT)  # the reader is inside a step
    assert engine.trie.owners() - {OUTPUT_OWNER}  # the call holds its branches
    stream.close()  # from this thread, while the reader's step runs
    assert engine.trie.owners() <= {OUTPUT_OWNER}
    thread.join(_WAIT)
    assert not thread.is_alive()
    assert_ended_cleanly(engine, stream, read, errors)


def test_close_from_another_thread_ends_a_text_reader_cleanly() -> None:
    close_while_reading(lambda stream: stream)


def test_close_from_another_thread_ends_a_chunk_reader_cleanly() -> None:
    close_while_reading(lambda stream: stream.chunks())


def test_aclose_from_another_task_ends_an_async_reader_cleanly() -> None:
    engine, watch, waiting = blocked_engine()

    async def main() -> tuple[TextStream, list[str], list[Any]]:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        watch(stream)
        read: list[str] = []
        errors: list[Any] = []

        async def consume() -> None:
            try:
                async for text in stream:
                    read.append(text)
            except Exception as err:
                errors.append(err)

        reader = asyncio.create_task(consume())
        assert await asyncio.to_thread(waiting.wait, _WAIT)
        await stream.aclose()  # while the reader task awaits its next text
        await asyncio.wait_for(reader, _WAIT)
        return stream, read, errors

    stream, read, errors = asyncio.run(main())
    assert_ended_cleanly(engine, stream, read, errors)


def test_close_before_reading_and_twice_is_harmless() -> None:
    engine, watch, _ = blocked_engine()
    stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
    watch(stream)
    stream.close()
    stream.close()
    assert list(stream) == []
    assert stream.stats.finish_reason == "abandoned"
    assert engine.trie.owners() <= {OUTPUT_OWNER}
