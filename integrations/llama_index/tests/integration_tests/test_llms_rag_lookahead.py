"""`LookaheadLLM` on the real default model: whatever the path, the text is plain greedy
decoding's."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.custom import CustomLLM

from llama_index.llms.rag_lookahead import LookaheadLLM
from rag_lookahead import DEFAULT_MODEL
from rag_lookahead.drafting import OUTPUT_OWNER
from tests.integration_tests.shared import MAX_NEW_TOKENS

QUESTION = "What is the capital of France? Answer in one sentence."
# A passage the model is asked to repeat, so that drafts from it are accepted.
PASSAGE = (
    "The queen lays up to two thousand eggs a day. Drones are male bees whose only task is to "
    "mate with queens from other colonies."
)
REPEAT = f"Repeat this text exactly: {PASSAGE}"


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, content=text)]


@pytest.fixture(scope="module")
def reference(llm: LookaheadLLM) -> str:
    """Plain greedy decoding of QUESTION as one user message, straight from the engine."""
    messages = [{"role": "user", "content": QUESTION}]
    completion = llm.engine.complete(messages, max_new_tokens=MAX_NEW_TOKENS)
    assert completion.stats.new_tokens > 3
    return completion.text


def test_is_a_llama_index_custom_llm() -> None:
    assert BaseLLM in LookaheadLLM.__mro__
    assert CustomLLM in LookaheadLLM.__mro__
    assert LookaheadLLM.class_name() == "LookaheadLLM"


def test_metadata_of_the_default_model(llm: LookaheadLLM) -> None:
    meta = llm.metadata
    assert meta.model_name == DEFAULT_MODEL
    assert meta.context_window == llm.engine.context_window == 8192
    assert meta.num_output == MAX_NEW_TOKENS
    assert meta.is_chat_model is True
    capped = LookaheadLLM(engine=llm.engine, context_window=10**6)
    assert capped.metadata.context_window == 8192
    assert LookaheadLLM(engine=llm.engine, context_window=512).metadata.context_window == 512


def test_complete_is_plain_greedy_through_the_chat_template(
    llm: LookaheadLLM, plain_llm: LookaheadLLM, reference: str
) -> None:
    response = llm.complete(QUESTION)
    assert response.text == reference
    plain = plain_llm.complete(QUESTION)
    assert plain.text == reference
    assert not response.text.startswith(QUESTION)  # only new text, no echoed prompt
    extra = response.additional_kwargs
    assert extra["completion_tokens"] == extra["lookahead"]["new_tokens"] > 0
    assert extra["prompt_tokens"] > len(QUESTION.split())
    assert extra["lookahead"]["finish_reason"] in ("eos", "length")
    assert not any(plain.additional_kwargs["lookahead"]["drafted_per_step"])  # it never drafted


def test_stream_complete_matches_complete(llm: LookaheadLLM, reference: str) -> None:
    responses = list(llm.stream_complete(QUESTION))
    *chunks, last = responses
    assert chunks and all(r.delta for r in chunks)
    assert "".join(r.delta or "" for r in chunks) == reference
    assert [r.text for r in chunks][-1] == reference  # text is cumulative
    assert last.delta == "" and last.text == reference
    stats = last.additional_kwargs["lookahead"]
    assert stats["new_tokens"] == last.additional_kwargs["completion_tokens"]
    assert {"tokens_per_s", "tokens_per_step", "acceptance_rate"} <= stats.keys()


def test_chat_and_stream_chat_share_the_formatting_of_complete(llm: LookaheadLLM, reference: str) -> None:
    chat = llm.chat(user(QUESTION))
    assert chat.message.role == MessageRole.ASSISTANT
    assert chat.message.content == reference
    assert chat.additional_kwargs["completion_tokens"] > 0
    *chunks, last = list(llm.stream_chat(user(QUESTION)))
    assert "".join(r.delta or "" for r in chunks) == reference
    assert last.message.content == reference and "lookahead" in last.additional_kwargs


def test_system_prompt_is_the_templates_system_message(llm: LookaheadLLM) -> None:
    system = "You are a terse geography assistant."
    with_system = LookaheadLLM(engine=llm.engine, system_prompt=system, max_new_tokens=16)
    messages = [ChatMessage(role=MessageRole.SYSTEM, content=system), *user(QUESTION)]
    expected = llm.engine.complete(
        [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
        max_new_tokens=16,
    ).text
    assert with_system.complete(QUESTION).text == expected
    assert with_system.chat(messages).message.content == expected


def test_stop_sequences_cut_exactly_also_while_streaming(llm: LookaheadLLM, reference: str) -> None:
    words = reference.split()
    assert len(words) >= 4, reference
    stop = " ".join(words[2:4])  # several tokens, in the middle of the answer
    expected = reference[: reference.index(stop)]
    assert llm.complete(QUESTION, stop=[stop]).text == expected
    assert llm.complete(QUESTION, stop=stop).text == expected
    deltas = [r.delta or "" for r in llm.stream_complete(QUESTION, stop=[stop])]
    assert "".join(deltas) == expected
    # A stop configured on the LLM applies to every call; a call's stop replaces it.
    with_stop = LookaheadLLM(engine=llm.engine, stop=[stop], max_new_tokens=MAX_NEW_TOKENS)
    assert with_stop.chat(user(QUESTION)).message.content == expected
    first = words[1]
    assert with_stop.complete(QUESTION, stop=[first]).text == reference[: reference.index(first)]
    assert with_stop.complete(QUESTION, stop=[]).text == reference
    plain = LookaheadLLM(engine=llm.engine, stop=[stop], lookahead=False)
    assert plain.complete(QUESTION).additional_kwargs["lookahead"]["finish_reason"] == "stop_string"


def test_per_call_generation_arguments(llm: LookaheadLLM, reference: str) -> None:
    short = llm.complete(QUESTION, max_new_tokens=3)
    assert short.additional_kwargs["completion_tokens"] == 3
    assert reference.startswith(short.text)
    assert llm.complete(QUESTION, max_tokens=3).text == short.text
    with pytest.raises(TypeError, match="unrelated"):
        llm.complete(QUESTION, unrelated="not ignored")


def test_documents_feed_the_drafts(llm: LookaheadLLM, plain_llm: LookaheadLLM) -> None:
    fast = llm.complete(REPEAT, documents=[PASSAGE], max_new_tokens=24)
    assert fast.text == plain_llm.complete(REPEAT, max_new_tokens=24).text
    stats = fast.additional_kwargs["lookahead"]
    assert sum(stats["accepted_per_step"]) > 0  # verified draft tokens, not only plain steps
    assert stats["steps"] < stats["new_tokens"] - 1


def test_async_variants_match_and_leave_the_event_loop_free(
    llm: LookaheadLLM, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = llm.engine.model
    in_forward = threading.Event()
    forward = model.forward

    def watched(*args: Any, **kwargs: Any) -> Any:
        in_forward.set()
        try:
            return forward(*args, **kwargs)
        finally:
            in_forward.clear()

    monkeypatch.setattr(model, "forward", watched)

    async def run() -> tuple[Any, ...]:
        seen_during_forward = 0
        done = asyncio.Event()

        async def watcher() -> None:
            # Runs only when the loop is free: if decoding blocked the loop, it could never run
            # while a forward pass is in progress.
            nonlocal seen_during_forward
            while not done.is_set():
                seen_during_forward += in_forward.is_set()
                await asyncio.sleep(0)

        watch_task = asyncio.create_task(watcher())
        completed = await llm.acomplete(QUESTION)
        stream = await llm.astream_complete(QUESTION)
        deltas = [r.delta async for r in stream]
        chat = await llm.achat(user(QUESTION))
        chat_stream = await llm.astream_chat(user(QUESTION))
        chat_deltas = [r.delta async for r in chat_stream]
        done.set()
        await watch_task
        return completed, seen_during_forward, deltas, chat, chat_deltas

    completed, seen_during_forward, deltas, chat, chat_deltas = asyncio.run(run())
    assert completed.text == reference and completed.delta is None
    assert completed.additional_kwargs["lookahead"]["new_tokens"] > 0
    assert "".join(d or "" for d in deltas) == reference
    assert chat.message.content == reference
    assert "".join(d or "" for d in chat_deltas) == reference
    assert seen_during_forward > 0  # the loop ran other tasks while the model was computing


def test_abandoned_async_stream_releases_its_trie_branches(llm: LookaheadLLM) -> None:
    before = llm.engine.trie.owners()

    async def run() -> None:
        stream = await llm.astream_complete(REPEAT, documents=[PASSAGE])
        async for _ in stream:
            break
        await stream.aclose()
        # The close runs after the step in flight, off the loop: wait for it (however slow the
        # machine), rather than for a fixed time.
        for _ in range(6000):
            if llm.engine.trie.owners() - {OUTPUT_OWNER} <= before:
                return
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert llm.engine.trie.owners() - {OUTPUT_OWNER} <= before


def test_closed_stream_releases_its_trie_branches(llm: LookaheadLLM) -> None:
    before = llm.engine.trie.owners()
    stream = llm.stream_complete(REPEAT, documents=[PASSAGE])
    next(stream)
    assert llm.engine.trie.owners() - before - {OUTPUT_OWNER}  # the call's prompt, documents
    stream.close()
    assert llm.engine.trie.owners() - {OUTPUT_OWNER} <= before


def test_threads_share_one_model(llm: LookaheadLLM, plain_llm: LookaheadLLM, reference: str) -> None:
    results: dict[int, str] = {}

    def work(i: int) -> None:
        target = llm if i % 2 == 0 else plain_llm
        results[i] = target.complete(QUESTION).text

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == dict.fromkeys(range(3), reference)


def test_an_engine_and_a_config_are_exclusive(llm: LookaheadLLM) -> None:
    from rag_lookahead import LookaheadConfig

    with pytest.raises(ValueError):
        LookaheadLLM(engine=llm.engine, config=LookaheadConfig(mode="off"))


def test_a_per_engine_setting_for_a_given_engine_is_refused_at_once(llm: LookaheadLLM) -> None:
    config = dataclasses.replace(llm.engine.config, prefix_cache_mb=llm.engine.config.prefix_cache_mb + 1)
    with pytest.raises(ValueError, match="prefix_cache_mb is set per engine"):
        LookaheadLLM(engine=llm.engine, lookahead_config=config)
