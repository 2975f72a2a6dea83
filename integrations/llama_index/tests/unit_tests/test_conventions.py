"""LlamaIndex's conventions on a tiny random model (no weights of size, offline): temperature,
exact token usage for `TokenCountingHandler`, a call's stop and unknown keyword arguments, and
a model loaded with your own options."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.llms import ChatMessage, MessageRole

from llama_index.llms.rag_lookahead import LookaheadLLM
from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.testing import read_past_deadline, save_tiny_model

N = 24
QUESTION = "Where is the lighthouse?"
MESSAGES = [{"role": "user", "content": QUESTION}]


pytestmark = pytest.mark.usefixtures("one_thread")


def greedy(engine: LookaheadEngine) -> str:
    return engine.plain().complete(MESSAGES, max_new_tokens=N).text


def test_temperature_zero_is_greedy_and_above_zero_samples(engine) -> None:
    llm = LookaheadLLM(engine=engine, max_new_tokens=N)
    assert llm.temperature == 0.0
    assert llm.complete(QUESTION).text == greedy(engine)
    assert llm.complete(QUESTION, temperature=0).text == greedy(engine)
    for seed in range(3):
        sampled = engine.plain().complete(
            MESSAGES, max_new_tokens=N, do_sample=True, temperature=0.8, seed=seed
        )
        assert llm.complete(QUESTION, temperature=0.8, seed=seed).text == sampled.text
        hot = LookaheadLLM(engine=engine, max_new_tokens=N, temperature=0.8)
        assert hot.complete(QUESTION, seed=seed).text == sampled.text
    # Sampling happened: some seed gives other text than greedy decoding.
    texts = {llm.complete(QUESTION, temperature=1.5, seed=seed).text for seed in range(4)}
    assert texts - {greedy(engine)}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"temperature": -0.5}, "temperature must be"),
        ({"temperature": "hot"}, "temperature must be"),
        ({"temperature": 0, "do_sample": True}, "needs a temperature above 0"),
    ],
)
def test_bad_temperatures_are_clear_errors(engine, kwargs, error) -> None:
    with pytest.raises(ValueError, match=error):
        LookaheadLLM(engine=engine).complete(QUESTION, **kwargs)


def test_explicit_do_sample_false_stays_greedy_at_any_temperature(engine) -> None:
    llm = LookaheadLLM(engine=engine, max_new_tokens=N)
    assert llm.complete(QUESTION, temperature=0.9, do_sample=False).text == greedy(engine)


def counting() -> tuple[TokenCountingHandler, CallbackManager]:
    # A tokenizer that overcounts wildly: the counts match only if exact usage was read.
    counter = TokenCountingHandler(tokenizer=lambda text: [0] * 10_000)
    return counter, CallbackManager([counter])


CALLS: dict[str, Callable[[LookaheadLLM], Any]] = {
    "complete": lambda llm: llm.complete(QUESTION),
    "stream_complete": lambda llm: list(llm.stream_complete(QUESTION))[-1],
    "chat": lambda llm: llm.chat([ChatMessage(role=MessageRole.USER, content=QUESTION)]),
    "stream_chat": lambda llm: list(llm.stream_chat([ChatMessage(role=MessageRole.USER, content=QUESTION)]))[
        -1
    ],
    "acomplete": lambda llm: asyncio.run(llm.acomplete(QUESTION)),
}


@pytest.mark.parametrize("call", CALLS)
def test_token_counting_handler_reads_the_exact_usage(engine, call: str) -> None:
    counter, manager = counting()
    llm = LookaheadLLM(engine=engine, max_new_tokens=N, callback_manager=manager)
    response = CALLS[call](llm)
    usage = response.raw["usage"]
    prompt_tokens = len(engine.encode(MESSAGES))
    cached = response.additional_kwargs["lookahead"]["cached_prompt_tokens"]
    assert usage == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": N,
        "total_tokens": prompt_tokens + N,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    assert response.additional_kwargs["prompt_tokens"] == prompt_tokens
    assert counter.prompt_llm_token_count == prompt_tokens
    assert counter.completion_llm_token_count == N


def test_a_repeated_prompt_reports_its_cached_tokens(engine) -> None:
    llm = LookaheadLLM(engine=engine, max_new_tokens=N)
    llm.complete(QUESTION)
    response = llm.complete(QUESTION)  # all but the last prompt token's entries are reused
    prompt_tokens = response.additional_kwargs["prompt_tokens"]
    assert response.additional_kwargs["prompt_tokens_details"] == {"cached_tokens": prompt_tokens - 1}
    assert response.raw["usage"]["prompt_tokens_details"] == {"cached_tokens": prompt_tokens - 1}


def _first_occurring(text: str, start: int) -> str:
    """A two-character stop string whose first occurrence is at ``start`` or later."""
    return next(text[i : i + 2] for i in range(start, len(text) - 2) if text.find(text[i : i + 2]) == i)


def test_a_calls_stop_replaces_the_llms_own(engine) -> None:
    reference = greedy(engine)
    first = _first_occurring(reference, 2)
    second = _first_occurring(reference, reference.find(first) + 4)
    early, late = reference[: reference.find(first)], reference[: reference.find(second)]
    llm = LookaheadLLM(engine=engine, max_new_tokens=N, stop=[first])
    assert llm.complete(QUESTION).text == early
    assert llm.complete(QUESTION, stop=[second]).text == late
    assert llm.complete(QUESTION, stop=second).text == late
    assert llm.complete(QUESTION, stop=[]).text == reference


@pytest.mark.parametrize("call", ["complete", "stream_complete", "chat", "stream_chat"])
def test_unknown_keyword_arguments_are_errors(engine, call: str) -> None:
    llm = LookaheadLLM(engine=engine)
    prompt: Any = QUESTION if "complete" in call else [ChatMessage(role=MessageRole.USER, content=QUESTION)]
    with pytest.raises(TypeError, match="num_beams"):
        getattr(llm, call)(prompt, num_beams=4)
    assert not engine.trie.owners() - {"__output__"}


def test_loading_options_reach_the_engine(tmp_path) -> None:
    llm = LookaheadLLM(
        model_name=str(save_tiny_model(tmp_path)),
        max_new_tokens=4,
        model_kwargs={"attn_implementation": "eager"},
        tokenizer_kwargs={"padding_side": "left"},
        chat_template_kwargs={"enable_thinking": False},
    )
    engine = llm.engine
    assert engine.model.config._attn_implementation == "eager"
    assert engine.tokenizer.padding_side == "left"
    response = llm.complete("hi")
    prompt = engine.tokenizer.decode(engine.encode([{"role": "user", "content": "hi"}]))
    assert prompt.endswith("/no_think assistant: ")
    assert response.raw["usage"]["prompt_tokens"] == len(prompt)


def test_progress_is_shown_while_loading_unless_told_not_to(tmp_path) -> None:
    model = str(save_tiny_model(tmp_path))
    assert LookaheadLLM(model_name=model).engine._progress is True  # on a terminal only
    assert LookaheadLLM(model_name=model, progress=False).engine._progress is False


@pytest.mark.parametrize(
    "option",
    [
        {"device": "cpu"},
        {"model_kwargs": {"x": 1}},
        {"chat_template_kwargs": {"x": 1}},
        {"trust_remote_code": True},
    ],
)
def test_loading_options_and_an_engine_are_exclusive(engine, option) -> None:
    with pytest.raises(ValueError, match="either an engine or options"):
        LookaheadLLM(engine=engine, **option)


def test_a_local_call_past_its_timeout_raises(engine) -> None:
    for call in ("stream_complete", "stream_chat"):
        prompt = (
            QUESTION if call == "stream_complete" else [ChatMessage(role=MessageRole.USER, content=QUESTION)]
        )
        responses = getattr(LookaheadLLM(engine=engine, max_new_tokens=200, timeout=0.05), call)(prompt)
        with pytest.raises(TimeoutError, match="timeout of 0.05 s"):
            read_past_deadline(responses, 0.05)
        assert not engine.trie.owners() - {"__output__"}  # the call ended and let go of its branches
    with pytest.raises(TimeoutError, match="timeout of 1e-09 s"):
        asyncio.run(LookaheadLLM(engine=engine, max_new_tokens=200, timeout=1e-9).acomplete(QUESTION))
    # A loose deadline changes nothing.
    loose = LookaheadLLM(engine=engine, max_new_tokens=N, timeout=600)
    assert loose.complete(QUESTION).text == greedy(engine)


def test_lookahead_config_sets_a_given_engines_drafting(engine) -> None:
    config = LookaheadConfig(mode="trie", decoding_length=4)
    llm = LookaheadLLM(engine=engine, lookahead_config=config, max_new_tokens=N)
    assert llm.engine.config == config and llm.engine.trie is engine.trie
    assert llm.complete(QUESTION).text == greedy(engine)
    renamed = pytest.warns(DeprecationWarning, match="lookahead_config")
    with renamed, pytest.raises(ValueError, match="either"):
        LookaheadLLM(engine=engine, config=config)  # its old name was a loading option
