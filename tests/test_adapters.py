"""The translation core: every request key into a `CallPlan`, every bad value a `RequestError`
naming its parameter, and the engine's text and stats into OpenAI's reply shapes."""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest

from rag_lookahead import GenerationParams
from rag_lookahead.protocol import (
    MAX_STOP_STRINGS,
    OPTION_KEYS,
    CallPlan,
    HeldReply,
    ReplyHeader,
    ReplyStream,
    RequestError,
    plan_call,
    plan_chat,
    plan_completion,
    reply,
    usage,
)
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.structured import Grammar, ToolFormat
from rag_lookahead.testing import ascii_fast_tokenizer, tiny_engine

MESSAGES = [{"role": "user", "content": "Hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SMOLLM2_TEMPLATE = (
    resources.files("rag_lookahead") / "data" / "chat_templates" / "smollm2-tools.jinja"
).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine()


@pytest.fixture(scope="module")
def tool_engine() -> Any:
    """What planning reads of an engine: a chat template with tool support."""
    return SimpleNamespace(
        chat=True, tokenizer=ascii_fast_tokenizer(SMOLLM2_TEMPLATE), chat_template_kwargs={}
    )


def chat(engine: Any, **request: Any) -> CallPlan:
    return plan_chat({"model": "m", "messages": MESSAGES, **request}, engine)


def refused(engine: Any, param: str | None, **request: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        chat(engine, **request)
    assert info.value.param == param, info.value
    return info.value


def stats(reason: str = "eos", new: int = 5) -> DecodeStats:
    return DecodeStats(
        prompt_tokens=7,
        new_tokens=new,
        steps=2,
        accepted_per_step=(2, 1),
        drafted_per_step=(4, 3),
        draft_sources=("trie", "trie"),
        prefill_seconds=0.0,
        seconds=0.0,
        finish_reason=reason,  # type: ignore[arg-type]
        cached_prompt_tokens=3,
    )


# ---------------------------------------------------------------------------- requests


def test_a_plain_chat_request(engine: Any) -> None:
    plan = chat(engine)
    assert plan.kind == "chat" and plan.model == "m"
    assert plan.prompt == ({"role": "user", "content": "Hi"},)
    assert plan.params == GenerationParams()
    assert plan.documents == () and not plan.stream and not plan.include_usage
    assert plan.stream_kwargs() == {"documents": []}


def test_every_generation_key(engine: Any) -> None:
    plan = chat(
        engine,
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        repetition_penalty=1.1,
        seed=3,
        stop=["\n", "END"],
        documents=["a doc", "another"],
        n=1,
    )
    p = plan.params
    assert (p.max_new_tokens, p.do_sample, p.temperature, p.top_p, p.top_k) == (12, True, 0.7, 0.9, 5)
    assert (p.repetition_penalty, p.seed, p.stop_strings) == (1.1, 3, ("\n", "END"))
    assert plan.documents == ("a doc", "another")
    assert plan.stream_kwargs() == {"documents": ["a doc", "another"]}


def test_temperature_zero_is_greedy(engine: Any) -> None:
    params = chat(engine, temperature=0).params
    assert not params.do_sample and params.temperature == 1.0
    assert chat(engine, temperature=0.0, seed=1).params.do_sample is False


def test_defaults_fill_what_the_request_leaves_out_and_stop_replaces(engine: Any) -> None:
    defaults = GenerationParams(max_new_tokens=40, stop_strings=("###",))
    body = {"messages": MESSAGES}
    assert plan_chat(body, engine, defaults).params == defaults
    assert plan_chat({**body, "stop": "x"}, engine, defaults).params.stop_strings == ("x",)
    assert plan_chat({**body, "max_completion_tokens": 9}, engine, defaults).params.max_new_tokens == 9


def test_max_tokens_and_max_completion_tokens(engine: Any) -> None:
    assert chat(engine, max_tokens=4, max_completion_tokens=4).params.max_new_tokens == 4
    refused(engine, "max_completion_tokens", max_tokens=4, max_completion_tokens=5)
    refused(engine, "max_tokens", max_tokens=0)
    refused(engine, "max_completion_tokens", max_completion_tokens=2.5)
    refused(engine, "max_tokens", max_tokens=True)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", "hot"),
        ("temperature", float("nan")),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", 0),
        ("repetition_penalty", 0),
        ("seed", -1),
        ("seed", 2**64),
        ("seed", 1.5),
        ("stop", ""),
        ("stop", ["a", ""]),
        ("stop", 3),
        ("stop", ["s"] * (MAX_STOP_STRINGS + 1)),
        ("n", 2),
        ("n", True),
        ("documents", "one string"),
        ("documents", ["ok", 3]),
        ("stream", "yes"),
        ("model", ""),
        ("model", 3),
    ],
)
def test_bad_values_name_their_parameter(engine: Any, key: str, value: Any) -> None:
    refused(engine, key, **{key: value})


def test_unknown_and_unsupported_keys(engine: Any) -> None:
    assert refused(engine, "verbosity", verbosity="low").code == "unknown_parameter"
    assert refused(engine, "frequency_penalty", frequency_penalty=0.5).code == "unsupported_value"
    refused(engine, "logprobs", logprobs=2)  # an integer is a completion's (legacy) logprobs
    refused(engine, "presence_penalty", presence_penalty=False)
    neutral = chat(
        engine, frequency_penalty=0, presence_penalty=0.0, logprobs=False, parallel_tool_calls=True
    )
    assert neutral.params == GenerationParams()
    assert chat(engine, temperature=None, stop=None).params == GenerationParams()  # null is absent
    with pytest.raises(RequestError, match="JSON object"):
        plan_chat([], engine)  # type: ignore[arg-type]


def test_streaming_keys(engine: Any) -> None:
    plan = chat(engine, stream=True, stream_options={"include_usage": True})
    assert plan.stream and plan.include_usage
    assert chat(engine, stream=True).include_usage is False
    refused(engine, "stream_options", stream_options={"include_usage": True})
    refused(engine, "stream_options", stream=True, stream_options={"other": 1})
    refused(engine, "stream_options", stream=True, stream_options=[1])
    refused(engine, "stream_options.include_usage", stream=True, stream_options={"include_usage": 1})


def test_messages(engine: Any) -> None:
    plan = plan_chat(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
                    ],
                },
                {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
            ]
        },
        engine,
    )
    system, user, assistant, tool = plan.prompt  # type: ignore[misc]
    assert system == {"role": "system", "content": "Be brief."}
    assert user == {"role": "user", "content": "ab"}
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert tool == {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (None, "messages"),
        ([], "messages"),
        ("Hi", "messages"),
        (["Hi"], "messages[0]"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "x", "audio": {}}], "messages[0].audio"),
        ([{"role": "user", "content": "x", "tool_call_id": "c"}], "messages[0].tool_call_id"),
        ([{"role": "user", "content": "x", "name": 3}], "messages[0].name"),
        ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
            "messages[0].tool_calls",
        ),
    ],
)
def test_bad_messages(engine: Any, messages: Any, param: str) -> None:
    with pytest.raises(RequestError) as info:
        plan_chat({"messages": messages}, engine)
    assert info.value.param == param


def test_a_model_without_chat_template() -> None:
    with pytest.raises(RequestError) as info:
        plan_chat({"messages": MESSAGES}, SimpleNamespace(chat=False))  # type: ignore[arg-type]
    assert (info.value.param, info.value.code) == ("messages", "no_chat_template")


def test_response_formats(engine: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(engine, response_format={"type": "text"}).params.grammar is None
    # Both close in budget, as a forced call does: whole whenever max_tokens holds the shortest.
    json_object = chat(engine, response_format={"type": "json_object"}).params.grammar
    assert json_object == Grammar.json().closing_in_budget()
    plan = chat(
        engine, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    )
    assert plan.params.grammar == Grammar.json_schema(schema).closing_in_budget()
    refused(engine, "response_format", response_format={"type": "yaml"})
    refused(engine, "response_format", response_format="json")
    refused(engine, "response_format.json_schema.schema", response_format={"type": "json_schema"})
    bad = {"type": "json_schema", "json_schema": {"schema": {"x": float("nan")}}}
    refused(engine, "response_format.json_schema.schema", response_format=bad)


def test_tools_auto_forced_and_none(tool_engine: Any) -> None:
    auto = chat(tool_engine, tools=[WEATHER])
    assert auto.tools.choice == "auto" and auto.tools.format == ToolFormat.named("smollm2")
    assert auto.params.grammar is None
    assert auto.stream_kwargs()["tools"][0]["function"]["name"] == "get_weather"
    forced = chat(tool_engine, tools=[WEATHER], tool_choice="required")
    assert forced.tools.choice == "any" and forced.params.grammar == forced.tools.format.grammar([WEATHER])  # type: ignore[union-attr]
    named = chat(
        tool_engine, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert named.tools.choice == "get_weather" and named.params.grammar is not None
    off = chat(tool_engine, tools=[WEATHER], tool_choice="none")
    assert off.tools.tools == () and off.tools.format is None and "tools" not in off.stream_kwargs()


def test_bad_tools(tool_engine: Any, engine: Any) -> None:
    refused(tool_engine, "tools", tools=[{"type": "function", "function": {"name": "bad name"}}])
    refused(tool_engine, "tools", tools={"a": 1})
    refused(tool_engine, "tool_choice", tools=[WEATHER], tool_choice="other_tool")
    refused(tool_engine, "tool_choice", tool_choice="required")  # forced, with no tools
    refused(tool_engine, "response_format", tools=[WEATHER], response_format={"type": "json_object"})
    assert refused(engine, "tools", tools=[WEATHER]).code == "tools_not_supported"


def test_completion_requests() -> None:
    plan = plan_completion({"model": "m", "prompt": "Once", "max_tokens": 3, "echo": False, "best_of": 1})
    assert (plan.kind, plan.prompt, plan.params.max_new_tokens) == ("completion", "Once", 3)
    assert plan_completion({"prompt": ["Once"]}).prompt == "Once"
    assert plan_completion({"prompt": [1, 2, 3]}).prompt == (1, 2, 3)
    assert plan_completion({"prompt": [[1, 2]]}).prompt == (1, 2)
    grammar = plan_completion({"prompt": "x", "response_format": {"type": "json_object"}}).params.grammar
    assert grammar == Grammar.json().closing_in_budget()


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "echo": True, "stream": True}, "echo"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
        ({"prompt": "x", "messages": MESSAGES}, "messages"),
        ({"prompt": "x", "tools": [WEATHER]}, "tools"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
    ],
)
def test_bad_completion_requests(request_body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        plan_completion(request_body)
    assert info.value.param == param


def test_plans_are_frozen(engine: Any) -> None:
    with pytest.raises(AttributeError):
        chat(engine).stream = True  # type: ignore[misc]


# ---------------------------------------------------------------------------- replies

HEADER = ReplyHeader("chatcmpl-1", 100, "tiny")


def test_usage_carries_the_decode_stats() -> None:
    assert usage(stats()) == {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        "lookahead": {
            "steps": 2,
            "tokens_per_step": 2.0,
            "accepted_draft_tokens": 3,
            "drafted_tokens": 7,
            "acceptance_rate": 3 / 7,
            "finish_reason": "eos",
            "undrafted_steps": {},
            "drafting_off_reason": None,
        },
    }


def test_a_whole_chat_reply(engine: Any) -> None:
    out = reply(chat(engine), HEADER, "Hello", stats("length"))
    assert out["object"] == "chat.completion" and out["id"] == "chatcmpl-1" and out["model"] == "tiny"
    assert out["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert out["usage"]["completion_tokens"] == 5


def test_a_whole_completion_reply() -> None:
    out = reply(
        plan_completion({"prompt": "x"}), ReplyHeader.new("completion", "tiny"), "abc", stats("stop_string")
    )
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert out["choices"] == [{"index": 0, "text": "abc", "logprobs": None, "finish_reason": "stop"}]


CALL_TEXT = 'Sure.\n<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]</tool_call>'


def test_a_reply_with_tool_calls(tool_engine: Any) -> None:
    out = reply(chat(tool_engine, tools=[WEATHER]), HEADER, CALL_TEXT, stats())
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Sure.\n"
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}


def test_a_call_that_does_not_parse_is_kept(tool_engine: Any) -> None:
    text = "<tool_call>[{broken</tool_call>"
    message = reply(chat(tool_engine, tools=[WEATHER]), HEADER, text, stats())["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] is None
    assert message["invalid_tool_calls"][0]["text"] == text
    plain = reply(chat(tool_engine, tools=[WEATHER]), HEADER, "No calls.", stats())["choices"][0]
    assert (
        plain["message"] == {"role": "assistant", "content": "No calls."} and plain["finish_reason"] == "stop"
    )


def streamed(plan: CallPlan, pieces: list[str], end: DecodeStats) -> list[dict[str, Any]]:
    out = ReplyStream(plan, HEADER)
    chunks = out.start()
    for piece in pieces:
        chunks += out.add(piece)
    return chunks + out.end(end)


def test_a_streamed_chat_reply(engine: Any) -> None:
    chunks = streamed(chat(engine, stream=True), ["Hel", "lo"], stats())
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}, {}]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]


def test_a_streamed_reply_with_usage(engine: Any) -> None:
    chunks = streamed(chat(engine, stream=True, stream_options={"include_usage": True}), ["a"], stats())
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage(stats())


def test_a_streamed_completion() -> None:
    chunks = streamed(plan_completion({"prompt": "x", "stream": True}), ["a", "b"], stats("length"))
    assert [c["choices"][0]["text"] for c in chunks] == ["a", "b", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


def test_a_streamed_tool_call_says_what_the_whole_reply_says(tool_engine: Any) -> None:
    plan = chat(tool_engine, tools=[WEATHER], stream=True)
    pieces = [CALL_TEXT[i : i + 3] for i in range(0, len(CALL_TEXT), 3)]
    chunks = streamed(plan, pieces, stats())
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == "Sure.\n"  # nothing of the call block leaks as content
    (calls,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0
    assert calls[0]["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    whole = reply(plan, HEADER, CALL_TEXT, stats())["choices"][0]["message"]
    assert whole["content"] == content


def test_held_text_that_opens_no_call_is_released(tool_engine: Any) -> None:
    plan = chat(tool_engine, tools=[WEATHER], stream=True)
    chunks = streamed(plan, ["a <tool", "_box> b"], stats())
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "a <tool_box> b"


def test_tools_on_an_engine_without_a_tokenizer_are_refused_by_name() -> None:
    serverish = SimpleNamespace(chat=True, tokenizer=None)
    error = refused(serverish, "tools", tools=[WEATHER])
    assert error.code == "tools_not_supported" and "no tokenizer" in error.message
    assert chat(serverish, tools=[WEATHER], tool_choice="none").tools.tools == ()


def test_a_front_ends_call_options_are_read_as_a_request_is(tool_engine: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    options = {"max_tokens": 4, "temperature": 0, "stop": ["."], "documents": ["d"], "tools": [WEATHER]}
    plan = plan_call("chat", messages, {**options, "tool_choice": "required"}, tool_engine)
    request = chat(tool_engine, **options, tool_choice="required")
    assert (plan.params, plan.tools, plan.documents) == (request.params, request.tools, request.documents)
    assert plan.prompt is messages and plan.model is None and not plan.stream
    text = plan_call("completion", "Once", {"temperature": 0.5, "response_format": {"type": "json_object"}})
    assert text.params.sampling and text.params.grammar == Grammar.json().closing_in_budget()
    chat_only = OPTION_KEYS["chat"] - OPTION_KEYS["completion"]
    assert chat_only == {"tools", "tool_choice", "max_completion_tokens"}


@pytest.mark.parametrize("key", ["model", "messages", "prompt", "stream", "n", "functions"])
def test_keys_only_a_request_carries_are_no_call_options(key: str) -> None:
    with pytest.raises(RequestError) as info:
        plan_call("chat", MESSAGES, {key: "x"})
    assert info.value.code == "unknown_parameter" and info.value.param == key
    known = info.value.message.split("known: ")[1].split(", ")
    assert "temperature" in known and not {"model", "messages", "stream"} & set(known)


def test_a_call_option_is_refused_with_the_requests_text(engine: Any) -> None:
    for key, value in (("temperature", 3), ("top_p", 0), ("stop", [""]), ("tools", [WEATHER])):
        with pytest.raises(RequestError) as info:
            plan_call("chat", MESSAGES, {key: value}, engine)
        assert info.value.message == refused(engine, key, **{key: value}).message
    with pytest.raises(RequestError, match="unknown parameter 'tools'"):
        plan_call("completion", "Once", {"tools": [WEATHER]})


def test_held_reply_shows_content_and_parses_what_it_held(tool_engine: Any) -> None:
    fmt = chat(tool_engine, tools=[WEATHER]).tools.format
    held = HeldReply(fmt)
    shown = "".join(held.add(CALL_TEXT[i : i + 2]) for i in range(0, len(CALL_TEXT), 2))
    rest = held.end()
    assert shown == "Sure.\n" and [c.name for c in rest.calls] == ["get_weather"]
    plain = HeldReply(None)
    assert plain.add("a <tool_call>") == "a <tool_call>" and plain.end().content == ""
    released = HeldReply(fmt)
    assert released.add("a <tool") == "a " and released.end().content == "<tool"


# ---------------------------------------------------------------------------- logprobs

TOKENS = [
    TokenLogprob("He", -0.25, 1, (TokenLogprob("He", -0.25, 1), TokenLogprob("Ha", -2.0, 2))),
    TokenLogprob("llo", -0.5, 3, (TokenLogprob("llo", -0.5, 3), TokenLogprob("y", -1.5, 4))),
]


def test_logprobs_keys_are_read(engine: Any) -> None:
    params = chat(engine, logprobs=True, top_logprobs=2).params
    assert params.logprobs and params.top_logprobs == 2
    assert not chat(engine, logprobs=False).params.logprobs
    legacy = plan_completion({"prompt": "x", "logprobs": 3}).params
    assert legacy.logprobs and legacy.top_logprobs == 3
    # A front end's completion takes logprobs as chat does; a request's is the legacy integer.
    assert plan_call("completion", "x", {"logprobs": True}).params.logprobs
    assert plan_call("chat", "x", {"logprobs": True, "top_logprobs": 4}).params.top_logprobs == 4
    over_default = GenerationParams(logprobs=True, top_logprobs=3)
    assert plan_call("chat", "x", {"logprobs": False}, defaults=over_default).params.top_logprobs == 0
    assert {"logprobs", "top_logprobs"} <= OPTION_KEYS["chat"] & OPTION_KEYS["completion"]


def test_bad_logprobs_name_their_parameter(engine: Any) -> None:
    refused(engine, "top_logprobs", top_logprobs=-1, logprobs=True)
    refused(engine, "top_logprobs", top_logprobs=21, logprobs=True)
    assert "needs logprobs" in str(refused(engine, "top_logprobs", top_logprobs=2))
    assert "needs logprobs" in str(refused(engine, "top_logprobs", top_logprobs=2, logprobs=False))
    refused(engine, "logprobs", logprobs="yes")
    for bad in (
        *({"logprobs": 21}, {"logprobs": -1}, {"logprobs": 2, "top_logprobs": 2}, {"logprobs": "1"}),
        *({"logprobs": True}, {"logprobs": False}, {"logprobs": True, "top_logprobs": 2}),
    ):
        with pytest.raises(RequestError) as info:
            plan_completion({"prompt": "x", **bad})
        assert info.value.param in ("logprobs", "top_logprobs")


def test_a_whole_chat_reply_with_logprobs(engine: Any) -> None:
    out = reply(chat(engine, logprobs=True, top_logprobs=2), HEADER, "Hello", stats(), TOKENS)
    content = out["choices"][0]["logprobs"]["content"]
    assert content[0] == {
        "token": "He",
        "logprob": -0.25,
        "bytes": [72, 101],
        "top_logprobs": [
            {"token": "He", "logprob": -0.25, "bytes": [72, 101]},
            {"token": "Ha", "logprob": -2.0, "bytes": [72, 97]},
        ],
    }
    assert [c["token"] for c in content] == ["He", "llo"]
    assert reply(chat(engine), HEADER, "Hello", stats(), TOKENS)["choices"][0]["logprobs"] is None


def test_a_whole_completion_reply_with_logprobs() -> None:
    plan = plan_completion({"prompt": "x", "logprobs": 1})
    out = reply(plan, ReplyHeader.new("completion", "tiny"), "Hello", stats(), TOKENS)
    assert out["choices"][0]["logprobs"] == {
        "tokens": ["He", "llo"],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{"He": -0.25, "Ha": -2.0}, {"llo": -0.5, "y": -1.5}],
        "text_offset": [0, 2],
    }


def test_streamed_logprobs_come_with_their_text(tool_engine: Any, engine: Any) -> None:
    out = ReplyStream(chat(engine, stream=True, logprobs=True), HEADER)
    chunks = out.start() + out.add("", TOKENS[:1]) + out.add("Hello", TOKENS[1:]) + out.end(stats())
    shapes = [c["choices"][0]["logprobs"] for c in chunks]
    # The first step's text was held back: its log probability comes with the text that shows it.
    assert shapes[0] is None and shapes[-1] is None
    assert [t["token"] for t in shapes[1]["content"]] == ["He", "llo"]
    plan = chat(tool_engine, tools=[WEATHER], stream=True, logprobs=True)
    out = ReplyStream(plan, HEADER)
    chunks = out.start() + out.add(CALL_TEXT, TOKENS) + out.end(stats())
    tokens = [
        t["token"]
        for c in chunks
        if c["choices"]
        for t in (c["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert tokens == ["He", "llo"]  # held with the call block, sent with the end


def test_a_streamed_completion_counts_its_text_offsets() -> None:
    out = ReplyStream(plan_completion({"prompt": "x", "stream": True, "logprobs": 0}), HEADER)
    chunks = out.add("He", TOKENS[:1]) + out.add("llo", TOKENS[1:]) + out.end(stats())
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in chunks[:2]] == [[0], [2]]
    assert chunks[1]["choices"][0]["logprobs"]["top_logprobs"] == [{"llo": -0.5, "y": -1.5}]
