"""Generation through both adapters on the tiny model: same text as plain decoding, only new
text, stop sequences, callbacks, metadata, call-time documents."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from langchain_rag_lookahead.chat_models import to_chat_messages
from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.protocol import RequestError, plan_chat
from rag_lookahead.testing import tiny_engine

N = 40
QUESTION = "Where is the lighthouse?"


def plain(engine: LookaheadEngine, prompt: Any, n: int = N) -> str:
    """Plain greedy decoding of ``prompt`` with the same model."""
    off = LookaheadEngine(engine.model, engine.tokenizer, LookaheadConfig(mode="off"))
    return off.complete(prompt, max_new_tokens=n).text


def chat_prompt(text: str = QUESTION) -> list[dict[str, str]]:
    return to_chat_messages([HumanMessage(text)])


class TokenRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


def test_chat_returns_only_the_new_text_of_plain_greedy_decoding(engine) -> None:
    reference = plain(engine, chat_prompt())
    result = ChatLookahead(engine=engine, max_tokens=N).invoke(QUESTION)
    assert result.content == reference
    assert ChatLookahead(engine=engine, max_tokens=N, lookahead=False).invoke(QUESTION).content == reference


def test_llm_returns_only_the_new_text_of_plain_greedy_decoding(engine) -> None:
    reference = plain(engine, QUESTION)
    assert LookaheadLLM(engine=engine, max_tokens=N).invoke(QUESTION) == reference
    assert "".join(LookaheadLLM(engine=engine, max_tokens=N).stream(QUESTION)) == reference


def test_usage_and_lookahead_stats_in_the_metadata(engine) -> None:
    message = ChatLookahead(engine=engine, max_tokens=N).invoke(QUESTION)
    prompt_tokens = len(engine.tokenizer.apply_chat_template(chat_prompt())["input_ids"])
    assert message.usage_metadata == {
        "input_tokens": prompt_tokens,
        "output_tokens": N,
        "total_tokens": prompt_tokens + N,
        "input_token_details": {"cache_read": message.response_metadata["lookahead"]["cached_prompt_tokens"]},
    }
    # Asked again, the prompt's KV entries come from the prefix cache (all but the last token's).
    again = ChatLookahead(engine=engine, max_tokens=N).invoke(QUESTION)
    assert again.usage_metadata["input_token_details"] == {"cache_read": prompt_tokens - 1}
    meta = message.response_metadata
    assert meta["model_name"] and meta["finish_reason"] == "length"
    stats = meta["lookahead"]
    assert stats["steps"] == len(stats["accepted_per_step"]) == len(stats["draft_sources"])
    assert stats["new_tokens"] == N and stats["finish_reason"] == "length"

    result = LookaheadLLM(engine=engine, max_tokens=N).generate([QUESTION, "Why?"])
    infos = [g[0].generation_info for g in result.generations]
    assert all(info["usage_metadata"]["output_tokens"] == N and "lookahead" in info for info in infos)
    assert result.llm_output["token_usage"]["output_tokens"] == 2 * N


def _stop_in(reference: str) -> tuple[str, str]:
    """A three-character stop string first occurring mid-text, and the text before it."""
    for start in range(N // 3, len(reference) - 3):
        stop = reference[start : start + 3]
        if reference.find(stop) > 0 and stop.strip():
            return stop, reference[: reference.find(stop)]
    raise AssertionError("no usable stop string in the reference")


def test_stop_sequences_cut_exactly_also_while_streaming(engine) -> None:
    reference = plain(engine, chat_prompt())
    stop, expected = _stop_in(reference)
    llm = ChatLookahead(engine=engine, max_tokens=N)
    assert llm.invoke(QUESTION, stop=[stop]).content == expected
    streamed = [chunk.content for chunk in llm.stream(QUESTION, stop=["never there", stop])]
    assert "".join(streamed) == expected  # no chunk leaked a partial stop string
    assert ChatLookahead(engine=engine, max_tokens=N, stop=[stop]).invoke(QUESTION).content == expected
    # A call's own stop list replaces the instance's.
    assert (
        ChatLookahead(engine=engine, max_tokens=N, stop=[stop]).invoke(QUESTION, stop=[]).content == reference
    )

    raw_reference = plain(engine, QUESTION)
    raw_stop, raw_expected = _stop_in(raw_reference)
    assert (
        "".join(LookaheadLLM(engine=engine, max_tokens=N).stream(QUESTION, stop=[raw_stop])) == raw_expected
    )


def test_every_chunk_reaches_on_llm_new_token(engine) -> None:
    llm = ChatLookahead(engine=engine, max_tokens=N)
    for streaming in (False, True):
        recorder = TokenRecorder()
        message = llm.invoke(QUESTION, config={"callbacks": [recorder]}, stream=streaming)
        assert "".join(recorder.tokens) == message.content
        assert len(recorder.tokens) > 2  # one per chunk, not one for the whole answer

    recorder = TokenRecorder()
    chunks = list(llm.stream(QUESTION, config={"callbacks": [recorder]}))
    assert recorder.tokens == [chunk.content for chunk in chunks]

    recorder = TokenRecorder()
    text = LookaheadLLM(engine=engine, max_tokens=N).invoke(QUESTION, config={"callbacks": [recorder]})
    assert "".join(recorder.tokens) == text and len(recorder.tokens) > 2


def test_documents_passed_at_call_time_feed_the_trie_of_that_call_only() -> None:
    engine = tiny_engine()
    reference = plain(engine, chat_prompt())
    document = QUESTION + " " + reference  # holds the whole answer
    seen: list[set[str]] = []

    class Owners(BaseCallbackHandler):
        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            seen.append(set(engine.trie.owners()))

    llm = ChatLookahead(engine=engine, max_tokens=N)
    with_docs = llm.invoke(
        QUESTION, documents=[Document(page_content=document)], config={"callbacks": [Owners()]}
    )
    assert with_docs.content == reference
    assert any(owners - {OUTPUT_OWNER} for owners in seen)  # the call's branches, during it
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # and gone after it

    without = ChatLookahead(engine=tiny_engine(), max_tokens=N).invoke(QUESTION)
    assert with_docs.response_metadata["lookahead"]["steps"] < without.response_metadata["lookahead"]["steps"]
    assert llm.invoke(QUESTION, documents=document).content == reference  # a bare string is fine


def test_unknown_call_options_are_rejected(engine) -> None:
    with pytest.raises(TypeError, match="unexpected call option"):
        ChatLookahead(engine=engine).invoke(QUESTION, functions=[])
    with pytest.raises(TypeError, match="unexpected call option"):
        LookaheadLLM(engine=engine).invoke(QUESTION, model="other")
    with pytest.raises(TypeError, match="unexpected call option"):
        LookaheadLLM(engine=engine).invoke(QUESTION, tools=[])  # a completion model takes no tools


def test_echo_is_refused_not_ignored(engine) -> None:
    """OpenAI's ``echo`` (the prompt before the answer) is a server's request key only."""
    llm = LookaheadLLM(engine=engine, max_tokens=4)
    with pytest.raises(RequestError, match="echo=True is not supported") as info:
        llm.invoke(QUESTION, echo=True)
    assert info.value.param == "echo"
    assert llm.invoke(QUESTION, echo=False) == llm.invoke(QUESTION)  # what it would do anyway


class RunRecorder(BaseCallbackHandler):
    """The metadata, tags and name of each model run, as it starts."""

    def __init__(self) -> None:
        self.runs: list[tuple[dict[str, Any], list[str], str | None]] = []

    def _record(self, kwargs: dict[str, Any]) -> None:
        self.runs.append((kwargs.get("metadata") or {}, sorted(kwargs.get("tags") or []), kwargs.get("name")))

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self._record(kwargs)

    def on_llm_start(self, serialized: Any, prompts: Any, **kwargs: Any) -> None:
        self._record(kwargs)


async def _gathered(chunks: Any) -> list[Any]:
    return [chunk async for chunk in chunks]


# How a run may be started; each takes LangChain's run keywords as the config's.
RUNS = {
    "invoke": lambda llm, **kw: llm.invoke(QUESTION, **kw),
    "stream": lambda llm, **kw: list(llm.stream(QUESTION, **kw)),
    "batch": lambda llm, **kw: llm.batch([QUESTION], **kw),
    "ainvoke": lambda llm, **kw: asyncio.run(llm.ainvoke(QUESTION, **kw)),
    "astream": lambda llm, **kw: asyncio.run(_gathered(llm.astream(QUESTION, **kw))),
}


@pytest.mark.parametrize("cls", [ChatLookahead, LookaheadLLM])
@pytest.mark.parametrize("run", sorted(RUNS))
def test_run_keywords_of_a_call_join_its_run(engine, cls, run) -> None:
    """``metadata=``, ``tags=``, ``run_name=`` beside the config: LangChain's own ``invoke``
    passes the config's to the run, and would pass a call's twice (a TypeError)."""
    recorder = RunRecorder()
    config = {"callbacks": [recorder], "metadata": {"user": "u"}, "tags": ["a"]}
    RUNS[run](
        cls(engine=engine, max_tokens=4), config=config, metadata={"app": "rag"}, tags=["b"], run_name="mine"
    )
    assert recorder.runs == [({"user": "u", "app": "rag", **_ls(recorder)}, ["a", "b"], "mine")]


def _ls(recorder: RunRecorder) -> dict[str, Any]:
    """The LangSmith keys LangChain adds to a run's metadata itself."""
    return {k: v for k, v in recorder.runs[0][0].items() if k.startswith("ls_")} if recorder.runs else {}


def test_call_options_are_read_as_the_servers_requests(engine) -> None:
    llm = ChatLookahead(engine=engine, max_tokens=N)
    request = {"messages": [{"role": "user", "content": QUESTION}]}
    for key, value in (("temperature", 3), ("top_k", 0), ("tools", [{"name": "f"}])):
        with pytest.raises(RequestError) as served:
            plan_chat({**request, key: value}, engine)
        with pytest.raises(RequestError) as called:
            llm.invoke(QUESTION, **{key: value})
        assert (called.value.message, called.value.param) == (served.value.message, key)
    with pytest.raises(RequestError, match="stop takes at most 16"):
        llm.invoke(QUESTION, stop=[str(i) for i in range(17)])
    greedy = llm.invoke(QUESTION, temperature=0, max_tokens=5).content
    assert greedy == llm.invoke(QUESTION, max_tokens=5).content


def test_call_options_override_fields(engine) -> None:
    message = ChatLookahead(engine=engine, max_tokens=N).invoke(QUESTION, max_tokens=5)
    assert message.usage_metadata["output_tokens"] == 5
    # Sampling: drafts change the random draws, so a seed repeats only without lookahead.
    sampled = ChatLookahead(engine=engine, max_tokens=N, temperature=0.7, seed=1, lookahead=False)
    assert sampled.invoke(QUESTION).content == sampled.invoke(QUESTION).content
    assert ChatLookahead(engine=engine, max_tokens=N, temperature=0.7).invoke(QUESTION).content


def test_other_chat_models_settings_are_accepted_by_a_local_model(engine) -> None:
    # LangChain's standard parameters: the key and retries are unused, a loose timeout changes nothing.
    llm = ChatLookahead(engine=engine, max_tokens=N, api_key="unused", max_retries=2, timeout=600)
    assert llm.invoke(QUESTION).content == plain(engine, chat_prompt())


def test_a_local_call_past_its_timeout_raises(engine) -> None:
    llm = ChatLookahead(engine=engine, max_tokens=200, timeout=0.05)
    chunks = llm.stream(QUESTION)
    next(chunks)
    time.sleep(1.0)  # an unread stream does not advance: the deadline passes while it waits
    with pytest.raises(TimeoutError, match="timeout of 0.05 s"):
        list(chunks)
