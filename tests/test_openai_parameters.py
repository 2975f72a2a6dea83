"""OpenAI's parameters that change nothing are accepted, those that can be honoured exactly are
(``logit_bias``, ``parallel_tool_calls: false``), and only the rest are refused, naming the
parameter: in the translation core, and over HTTP with the ``openai`` client."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from importlib import resources
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.protocol import (
    CallPlan,
    ReplyHeader,
    ReplyStream,
    RequestError,
    openai_to_params,
    params_to_openai,
    plan_call,
    plan_chat,
    plan_completion,
    reply,
)
from rag_lookahead.protocol.requests import IGNORED_KEYS
from rag_lookahead.remote import ServerEngine
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.structured import ToolFormat
from rag_lookahead.testing import ASCII_VOCAB, ascii_fast_tokenizer, grammar_accepts, tiny_model
from rag_lookahead.testing.local_server import WAIT_S, LiveServer, error_of

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SMOLLM2_TEMPLATE = (
    resources.files("rag_lookahead") / "data" / "chat_templates" / "smollm2-tools.jinja"
).read_text(encoding="utf-8")
HEADER = ReplyHeader("chatcmpl-1", 100, MODEL)

# What OpenAI documents as leaving the answer alone, or asks for what is done anyway.
ACCEPTED: list[tuple[str, Any]] = [
    ("user", "user-1234"),
    ("safety_identifier", "a1b2c3"),
    ("prompt_cache_key", "rag-app"),
    ("store", False),
    ("metadata", {"app": "rag", "run": "7"}),
    ("metadata", {}),
    ("service_tier", "auto"),
    ("service_tier", "flex"),
    ("modalities", ["text"]),
    ("logit_bias", {}),
    ("parallel_tool_calls", False),
    ("parallel_tool_calls", True),
    # OpenAI's own parameters that this server refuses: their null asks for nothing.
    ("audio", None),
    ("functions", None),
    ("reasoning_effort", None),
]

# (key, value, the code of the error, or None): each refused, naming its key.
REFUSED: list[tuple[str, Any, str | None]] = [
    ("store", True, "unsupported_value"),
    ("store", "false", "unsupported_value"),
    ("modalities", ["text", "audio"], "unsupported_value"),
    ("modalities", ["audio"], "unsupported_value"),
    ("modalities", "text", "unsupported_value"),
    ("service_tier", "gold", None),
    ("metadata", {"run": 7}, None),
    ("metadata", ["a"], None),
    ("user", 1234, None),
    ("prompt_cache_key", ["a"], None),
    ("parallel_tool_calls", "false", None),
    ("logit_bias", {"5": 101}, None),
    ("logit_bias", {"5": -100.5}, None),
    ("logit_bias", {"5": "1"}, None),
    ("logit_bias", {"5": True}, None),
    ("logit_bias", {"five": 1}, None),
    ("logit_bias", {"-5": 1}, None),
    ("logit_bias", {"05": 1}, None),
    ("logit_bias", {"5.0": 1}, None),
    ("logit_bias", {" 5": 1}, None),
    ("logit_bias", {"1" + "0" * 40: 1}, None),
    ("logit_bias", [5], None),
    ("foo", None, "unknown_parameter"),  # a null is as absent for a key OpenAI's API has only
]

# What changes the answer and cannot be honoured here: still refused, never ignored.
UNKNOWN = ["verbosity", "reasoning_effort", "web_search_options", "audio", "functions", "moderation"]


@pytest.fixture(scope="module")
def tool_engine() -> Any:
    """What planning reads of an engine: a chat template with tool support."""
    return SimpleNamespace(
        chat=True, tokenizer=ascii_fast_tokenizer(SMOLLM2_TEMPLATE), chat_template_kwargs={}
    )


def chat(engine: Any, **request: Any) -> CallPlan:
    return plan_chat({"model": MODEL, "messages": MESSAGES, **request}, engine)


def stats() -> DecodeStats:
    return DecodeStats(
        prompt_tokens=7,
        new_tokens=5,
        steps=2,
        accepted_per_step=(2, 1),
        drafted_per_step=(4, 3),
        draft_sources=("trie", "trie"),
        prefill_seconds=0.0,
        seconds=0.0,
        finish_reason="eos",
    )


# ---------------------------------------------------------------------------- the core


@pytest.mark.parametrize(("key", "value"), ACCEPTED)
def test_what_changes_nothing_is_accepted_and_plans_the_same_call(
    tool_engine: Any, key: str, value: Any
) -> None:
    assert chat(tool_engine, **{key: value}) == chat(tool_engine)
    completion = {"model": MODEL, "prompt": "Once"}
    assert plan_completion({**completion, key: value}) == plan_completion(completion)
    assert plan_call("chat", MESSAGES, {key: value}) == plan_call("chat", MESSAGES, {})  # a front end's


@pytest.mark.parametrize(("key", "value", "code"), REFUSED)
def test_what_cannot_be_honoured_is_refused_naming_its_parameter(
    tool_engine: Any, key: str, value: Any, code: str | None
) -> None:
    for plan in (
        lambda: chat(tool_engine, **{key: value}),
        lambda: plan_completion({"prompt": "x", key: value}),
    ):
        with pytest.raises(RequestError) as info:
            plan()
        assert (info.value.param, info.value.code) == (key, code), info.value


@pytest.mark.parametrize("key", UNKNOWN)
def test_unknown_keys_are_still_refused(tool_engine: Any, key: str) -> None:
    with pytest.raises(RequestError) as info:
        chat(tool_engine, **{key: "x"})
    assert (info.value.param, info.value.code) == (key, "unknown_parameter")
    assert set(info.value.message.split("known: ")[1].split(", ")) >= IGNORED_KEYS


def openai_parameters(create: Any) -> list[str]:
    """The request keys an ``openai`` client's ``create`` sends."""
    return [
        name
        for name in inspect.signature(create).parameters
        if name != "self" and not name.startswith("extra_")
    ]


def test_a_null_of_every_openai_parameter_asks_for_nothing(tool_engine: Any) -> None:
    """A client may spell out OpenAI's defaults as nulls: every parameter of the ``openai``
    client's own list is then the request without it (an unknown key's null is refused)."""
    for name in openai_parameters(openai.resources.chat.completions.Completions.create):
        if name not in ("model", "messages", "timeout"):
            assert chat(tool_engine, **{name: None}) == chat(tool_engine), name
    completion = {"model": MODEL, "prompt": "Once"}
    for name in openai_parameters(openai.resources.completions.Completions.create):
        if name not in ("model", "prompt", "timeout"):
            assert plan_completion({**completion, name: None}) == plan_completion(completion), name


def test_logit_bias_is_read_as_token_ids_to_biases_and_written_back() -> None:
    params = openai_to_params(
        {"logit_bias": {"17": -100, "5": 2.5, "0": 0}}, GenerationParams(), None, chat=True
    )
    assert params.logit_bias == ((0, 0.0), (5, 2.5), (17, -100.0))
    fields, extra = params_to_openai(params, chat=True)
    assert fields["logit_bias"] == {"0": 0, "5": 2.5, "17": -100} and not extra
    assert openai_to_params({**fields, **extra}, GenerationParams(), None, chat=True) == params
    assert plan_call("completion", "x", {"logit_bias": {5: 1}}).params.logit_bias == (
        (5, 1.0),
    )  # a front end's ints
    assert "logit_bias" not in params_to_openai(GenerationParams(), chat=False)[0]


# ---------------------------------------------------------------------------- parallel_tool_calls

TWO_CALLS = {
    "smollm2": 'Sure.<tool_call>[{"name": "a", "arguments": {}}, '
    '{"name": "b", "arguments": {"k": 1}}]</tool_call>',
    "hermes": '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
    '<tool_call>\n{"name": "b", "arguments": {"k": 1}}\n</tool_call>',
    "llama3": '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": 1}}',
}


@pytest.mark.parametrize("name", sorted(TWO_CALLS))
def test_one_call_formats_keep_a_reply_s_first_call(name: Any) -> None:
    fmt = ToolFormat.named(name)
    both = fmt.parse(TWO_CALLS[name])
    assert [c.name for c in both.calls] == ["a", "b"]
    one = fmt.one_call().parse(TWO_CALLS[name])
    assert [c.name for c in one.calls] == ["a"] and one.content == both.content and not one.invalid
    assert fmt.one_call().parse("No call.").calls == ()
    assert fmt.one_call() != fmt and fmt.one_call().name == fmt.name


def test_parallel_tool_calls_false_returns_at_most_one_call(tool_engine: Any) -> None:
    plan = chat(tool_engine, tools=[WEATHER], parallel_tool_calls=False)
    assert plan.tools.format == ToolFormat.named("smollm2").one_call()
    message = reply(plan, HEADER, TWO_CALLS["smollm2"], stats())["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["a"]
    assert (
        len(
            reply(chat(tool_engine, tools=[WEATHER]), HEADER, TWO_CALLS["smollm2"], stats())["choices"][0][
                "message"
            ]["tool_calls"]
        )
        == 2
    )
    out = ReplyStream(chat(tool_engine, tools=[WEATHER], parallel_tool_calls=False, stream=True), HEADER)
    chunks = out.start() + out.add(TWO_CALLS["smollm2"]) + out.end(stats())
    calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", ())]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "a")]


def test_a_forced_call_s_grammar_allows_exactly_one_call(tool_engine: Any) -> None:
    single = chat(tool_engine, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert single.params == chat(tool_engine, tools=[WEATHER], tool_choice="required").params
    grammar = single.params.grammar
    assert grammar is not None
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert grammar_accepts(grammar, f"<tool_call>[\n{call}\n]</tool_call>")
    assert not grammar_accepts(grammar, f"<tool_call>[\n{call}, {call}\n]</tool_call>")
    assert not grammar_accepts(
        grammar, f"<tool_call>[\n{call}\n]</tool_call><tool_call>[\n{call}\n]</tool_call>"
    )


# ---------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    """The tiny model under a small chat template (a forced call over HTTP is tested in
    test_http_server.py, under a template the tiny vocabulary can spell calls in)."""
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    config = LookaheadConfig(mode="trie", min_query_length=1)
    return LookaheadEngine(model, ascii_fast_tokenizer(), config)


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as server:
        yield server


def post(live: LiveServer, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{live.url}/v1/{route}", json={"model": MODEL, "max_tokens": 6, **body}, timeout=WAIT_S
    )


def test_each_accepted_parameter_gets_the_same_answer_over_http(live: LiveServer) -> None:
    chat_answer = post(live, "chat/completions", {"messages": MESSAGES}).json()["choices"][0]["message"]
    text_answer = post(live, "completions", {"prompt": "Once"}).json()["choices"][0]["text"]
    for key, value in ACCEPTED:
        out = post(live, "chat/completions", {"messages": MESSAGES, key: value})
        assert out.status_code == 200, (key, out.text)
        assert out.json()["choices"][0]["message"] == chat_answer
        out = post(live, "completions", {"prompt": "Once", key: value})
        assert out.status_code == 200 and out.json()["choices"][0]["text"] == text_answer, (key, out.text)


def test_the_openai_client_sends_them_all_at_once(live: LiveServer) -> None:
    client = live.client()
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        user="u",
        safety_identifier="s",
        prompt_cache_key="k",
        store=False,
        metadata={"app": "rag"},
        service_tier="default",
        modalities=["text"],
        logit_bias={},
        parallel_tool_calls=False,
        frequency_penalty=0,
        presence_penalty=0,
    )
    assert out.choices[0].message.content is not None


def test_logit_bias_over_http_is_the_engine_s_biased_answer(
    live: LiveServer, engine: LookaheadEngine
) -> None:
    plain = engine.complete("Once", max_new_tokens=8)
    bias = {plain.token_ids[0]: -100, 40: 5}
    expected = engine.complete("Once", max_new_tokens=8, logit_bias=bias)
    assert expected.text != plain.text
    body = {"prompt": "Once", "max_tokens": 8, "logit_bias": {str(t): b for t, b in bias.items()}}
    assert post(live, "completions", body).json()["choices"][0]["text"] == expected.text
    streamed = httpx.post(
        f"{live.url}/v1/completions", json={**body, "model": MODEL, "stream": True}, timeout=WAIT_S
    )
    pieces = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "".join(p["choices"][0]["text"] for p in pieces) == expected.text


def test_a_server_engine_forwards_the_bias(live: LiveServer, engine: LookaheadEngine) -> None:
    """`ServerEngine` writes the params back as a request (`params_to_openai`): the bias too."""
    bias = {engine.complete("Once", max_new_tokens=1).token_ids[0]: -100.0}
    remote = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0)
    expected = engine.complete("Once", max_new_tokens=8, logit_bias=bias).text
    assert remote.complete("Once", max_new_tokens=8, logit_bias=bias).text == expected


@pytest.mark.parametrize(
    ("key", "value", "code"), [r for r in REFUSED if r[0] in ("store", "logit_bias", "modalities")]
)
def test_refused_over_http_as_400_naming_the_parameter(
    live: LiveServer, key: str, value: Any, code: str | None
) -> None:
    error = error_of(post(live, "chat/completions", {"messages": MESSAGES, key: value}), 400)
    assert (error["param"], error["code"]) == (key, code), error


def test_a_bias_for_a_token_past_the_vocabulary_is_400_naming_logit_bias(live: LiveServer) -> None:
    for route, body in (("chat/completions", {"messages": MESSAGES}), ("completions", {"prompt": "Once"})):
        error = error_of(post(live, route, {**body, "logit_bias": {"5": 1, str(ASCII_VOCAB + 1): -100}}), 400)
        assert "logit_bias" in error["message"] and "vocabulary" in error["message"], error
    assert httpx.get(f"{live.url}/health", timeout=WAIT_S).status_code == 200
