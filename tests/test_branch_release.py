"""A call's trie branches leave with it: however the consumer stops, raises or forgets it."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine, TokenTrie
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.streaming import aiterate
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_model

PROMPT = [3, 14, 15, 9, 26]
N = 16
DOCUMENT = "一丁七万丈三上下"


def make_engine(**config: object) -> LookaheadEngine:
    settings = LookaheadConfig(mode="trie", min_query_length=1, **config)  # type: ignore[arg-type]
    return LookaheadEngine(tiny_model("llama"), CharTokenizer(), settings)


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

    try:
        consume()
    except RuntimeError:
        assert call_owners(engine)  # the traceback still holds the stream here
    assert not call_owners(engine)  # the handled exception is gone, and the branches with it


def test_a_break_out_of_an_unnamed_stream_releases_the_branches() -> None:
    engine = make_engine()
    for _ in engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT]):
        break
    assert not call_owners(engine)


def test_a_stream_dropped_half_read_releases_the_branches() -> None:
    engine = make_engine()
    stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
    next(stream)
    assert call_owners(engine)
    del stream
    assert not call_owners(engine)


def test_closing_the_chunks_closes_the_stream() -> None:
    engine = make_engine()
    stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
    chunks = stream.chunks()
    next(chunks)
    chunks.close()
    assert not call_owners(engine) and stream.stats.finish_reason == "abandoned"


def test_a_with_block_releases_the_branches_even_when_it_raises() -> None:
    engine = make_engine()
    kept = []
    try:
        with engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT]) as stream:
            kept.append(stream)
            next(stream)
            raise KeyError("boom")
    except KeyError:
        pass
    assert kept and not call_owners(engine)


def test_a_forgotten_stream_loses_its_branches_once_it_is_idle() -> None:
    engine = make_engine(idle_release_seconds=1e-9)  # any pause is "too long"

    def consume() -> None:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        next(stream)
        raise ValueError("kept, as sys.last_traceback keeps it in a REPL")

    try:
        consume()
    except ValueError:
        kept = sys.exc_info()  # the traceback keeps the stream referenced, never advanced
    assert call_owners(engine)
    reference = greedy_reference(engine.model, PROMPT, N)
    assert engine.complete(PROMPT, max_new_tokens=N).token_ids == reference  # another call drafts
    assert not call_owners(engine)
    # The forgotten stream still reads to the end, with the same output.
    stream = kept[2].tb_next.tb_frame.f_locals["stream"]  # type: ignore[union-attr]
    assert stream.token_ids + stream.complete().token_ids[len(stream.token_ids) :] == reference
    assert not call_owners(engine)


def test_a_scope_is_never_released_for_being_idle() -> None:
    engine = make_engine(idle_release_seconds=1e-9)
    with engine.scope([DOCUMENT]) as scope:
        engine.complete(PROMPT, max_new_tokens=N)
        assert scope.owner in engine.trie.owners()
    assert not call_owners(engine)


def test_idle_leases_are_released_by_others_only() -> None:
    trie = TokenTrie()
    trie.insert([1, 2, 3], "a")
    trie.insert([1, 2, 3], "b")
    trie.lease("a")
    trie.lease("b")
    assert trie.release_idle(10.0, keep="b", now=1e12) == ["a"]
    assert trie.owners() == {"b"}
    assert trie.release_idle(10.0, keep="b", now=1e12) == []


def test_an_async_consumer_that_stops_early_releases_the_branches() -> None:
    engine = make_engine()

    async def consume() -> None:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=[DOCUMENT])
        chunks = aiterate(stream.chunks())
        async for _ in chunks:
            break
        await chunks.aclose()
        while call_owners(engine):  # the worker closes the stream after its step in flight
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(consume(), timeout=60))
    assert not call_owners(engine)
