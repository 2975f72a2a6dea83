"""A call's trie branches leave with it: however the consumer stops, raises or forgets it.

The engine's loop runs ahead of its readers; a short call could end between its first read
and the next line, so the tests that look at a call's branches while it runs hold the loop
(`holding`) until they have looked.
"""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.streaming import aiterate
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_model
from rag_lookahead.testing.holding import holding

PROMPT = [3, 14, 15, 9, 26]
N = 16
DOCUMENT = "一丁七万丈三上下"


def make_engine() -> LookaheadEngine:
    return LookaheadEngine(
        tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1)
    )


def call_owners(engine: LookaheadEngine) -> set[str]:
    return engine.trie.owners() - {OUTPUT_OWNER}


@pytest.fixture(autouse=True)
def no_collector():
    """Release must not wait for the cyclic garbage collector: keep it off during each test."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_an_exception_in_the_consumer_loop_releases_the_branches() -> None:
    engine = make_engine()

    def consume() -> None:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        for _ in stream:
            raise RuntimeError("the consumer failed")

    with holding(engine, PROMPT) as hold:
        try:
            consume()
        except RuntimeError:
            assert call_owners(engine)  # the traceback still holds the stream here
            hold.release_soon()
    assert not call_owners(engine)  # the handled exception is gone, and the branches with it


def test_a_break_out_of_an_unnamed_stream_releases_the_branches() -> None:
    engine = make_engine()
    with holding(engine, PROMPT) as hold:
        for _ in engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT]):
            assert call_owners(engine)
            hold.release_soon()
            break
    assert not call_owners(engine)


def test_a_stream_dropped_half_read_releases_the_branches() -> None:
    engine = make_engine()
    with holding(engine, PROMPT) as hold:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        next(stream)
        assert call_owners(engine)
        hold.release_soon()
        del stream
    assert not call_owners(engine)


def test_a_stream_dropped_unread_releases_the_branches() -> None:
    engine = make_engine()
    stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
    del stream
    assert not call_owners(engine)


def test_closing_the_chunks_closes_the_stream() -> None:
    engine = make_engine()
    with holding(engine, PROMPT) as hold:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        chunks = stream.chunks()
        next(chunks)
        hold.release_soon()
        chunks.close()
    assert not call_owners(engine) and stream.stats.finish_reason == "abandoned"


def test_a_with_block_releases_the_branches_even_when_it_raises() -> None:
    engine = make_engine()
    with (
        holding(engine, PROMPT) as hold,
        pytest.raises(KeyError),
        engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT]) as stream,
    ):
        next(stream)
        assert call_owners(engine)
        hold.release_soon()
        raise KeyError("boom")
    assert not call_owners(engine)


def test_a_forgotten_stream_is_finished_by_the_calls_after_it() -> None:
    engine = make_engine()

    def consume() -> None:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        next(stream)
        raise ValueError("kept, as sys.last_traceback keeps it in a REPL")

    try:
        consume()
    except ValueError:
        kept = sys.exc_info()  # the traceback keeps the stream referenced, never read again
    stream = kept[2].tb_next.tb_frame.f_locals["stream"]  # type: ignore[union-attr]
    assert call_owners(engine)
    engine.complete([2, 7, 1, 8], max_new_tokens=2 * N)  # meanwhile every running call goes on
    assert stream.stats.finish_reason == "length" and not call_owners(engine)
    assert stream.complete().token_ids == greedy_reference(engine.model, PROMPT, N)


def test_a_scope_outlives_its_calls_and_leaves_when_closed() -> None:
    engine = make_engine()
    with engine.scope([DOCUMENT]) as scope:
        engine.complete(PROMPT, max_new_tokens=N, scope=scope)
        assert call_owners(engine) == {scope.owner}
    assert not call_owners(engine)


def test_an_async_consumer_that_stops_early_releases_the_branches() -> None:
    engine = make_engine()

    async def consume() -> None:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        chunks = aiterate(stream.chunks())
        async for _ in chunks:
            break
        await chunks.aclose()
        while call_owners(engine):  # the bridge's thread closes it once its next item arrives
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(consume(), timeout=60))
    assert not call_owners(engine)
