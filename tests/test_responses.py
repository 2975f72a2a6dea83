"""``POST /v1/responses`` with the real `openai` client against a live server on 127.0.0.1.

A Responses request is the chat request it means: its greedy answer, whole or streamed, is
the chat route's and the in-process engine's, its calls are the chat route's calls, and its
events come in the documented order (the client's `responses.stream` checks it). Nothing is
stored: ``store: true`` and ``previous_response_id`` are 400s, as is anything unknown, each
naming the Responses parameter at fault.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from rag_lookahead import LookaheadEngine
from rag_lookahead.protocol.responses import plan_response
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.testing import SMALL_SCHEMA, packaged_template, tiny_tool_engine, weather_tool
from rag_lookahead.testing.local_server import DEAD_END_FORMAT, WAIT_S, LiveServer, error_of, served_engine

MODEL = "tiny"
QUESTION = "Tell me about the normans."
DOCUMENTS = ["The Normans were the people who gave their name to Normandy, a region in France."]
N = 24
CITY = weather_tool({"enum": ["Paris", "Rome"]})
FLAT_CITY = {"type": "function", **CITY["function"], "strict": True}  # the Responses shape
SCHEMA_FORMAT = {"type": "json_schema", "name": "small", "schema": SMALL_SCHEMA, "strict": True}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as server:
        yield server


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return live.client()


@pytest.fixture(scope="module")
def tools_client() -> Iterator[openai.OpenAI]:
    """A server of the tiny model under the packaged template that renders tools."""
    with LiveServer(
        create_app(tiny_tool_engine(packaged_template()), ServeSettings(model_name=MODEL))
    ) as server:
        yield server.client()


def squeezed(types: list[str]) -> list[str]:
    """``types`` with each run of one type as one."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


# ---------------------------------------------------------------------------- answers


def test_text_is_the_chat_answer(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    expected = engine.complete([{"role": "user", "content": QUESTION}], max_new_tokens=N)
    assert expected.stats.finish_reason == "length"  # the tiny model runs to its budget
    out = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=N, temperature=0)
    assert out.id.startswith("resp_") and out.object == "response" and out.model == MODEL
    assert out.output_text == expected.text
    assert (out.status, out.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    (message,) = out.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert out.usage is not None
    assert (out.usage.input_tokens, out.usage.output_tokens) == (
        expected.stats.prompt_tokens,
        expected.stats.new_tokens,
    )
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.model_extra["lookahead"]["finish_reason"] == "length"
    assert (out.temperature, out.top_p, out.max_output_tokens, out.store) == (0.0, 1.0, N, False)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=N
    )
    assert chat.choices[0].message.content == out.output_text


def test_instructions_and_message_items(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": QUESTION},
    ]
    expected = engine.complete(messages, max_new_tokens=N, documents=DOCUMENTS).text
    out = client.responses.create(
        model=MODEL,
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {  # a previous response's message, sent back as it came
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}],
            },
            {"role": "user", "content": QUESTION},
        ],
        max_output_tokens=N,
        store=False,
        extra_body={"documents": DOCUMENTS},
    )
    assert out.output_text == expected and out.instructions == "Be brief."


def test_bookkeeping_and_extensions_are_the_chat_route_s(
    client: openai.OpenAI, engine: LookaheadEngine
) -> None:
    """What changes nothing is accepted as chat accepts it; a prediction drafts, losslessly."""
    expected = engine.complete([{"role": "user", "content": QUESTION}], max_new_tokens=N).text
    out = client.responses.create(
        model=MODEL,
        input=QUESTION,
        max_output_tokens=N,
        user="someone",
        metadata={"run": "7"},
        service_tier="auto",
        parallel_tool_calls=False,
        store=False,
        include=[],
        truncation="disabled",
        extra_body={"prediction": {"type": "content", "content": expected}},
    )
    assert out.output_text == expected
    assert (out.metadata, out.parallel_tool_calls) == ({"run": "7"}, False)
    assert (
        out.usage is not None and "accepted_prediction_tokens" in out.usage.output_tokens_details.model_extra
    )
    error = bad_request(client, input=QUESTION, metadata={"run": 7})
    assert error.param == "metadata"


def test_a_null_of_every_openai_parameter_asks_for_nothing(engine: LookaheadEngine) -> None:
    """A client may spell out OpenAI's defaults as nulls: every parameter of the ``openai``
    client's own list is then the request without it (an unknown key's null is refused)."""
    request = {"model": MODEL, "input": QUESTION}
    names = inspect.signature(openai.resources.responses.Responses.create).parameters
    for name in names:
        if name not in ("self", "model", "input", "timeout") and not name.startswith("extra_"):
            assert plan_response({**request, name: None}, engine).call == plan_response(request, engine).call


def test_a_streamed_response_is_the_whole_one_in_order(client: openai.OpenAI, live: LiveServer) -> None:
    whole = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=N)
    events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=N, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert squeezed([e.type for e in events]) == [*TEXT_EVENTS, "response.incomplete"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == whole.output_text
    done = next(e for e in events if e.type == "response.output_item.done")
    assert {e.item_id for e in deltas} == {done.item.id} and done.item.status == "incomplete"
    last = events[-1].response
    assert last.status == "incomplete" and last.output_text == whole.output_text
    assert last.usage.output_tokens == whole.usage.output_tokens
    body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{live.base_url}/responses", json=body, timeout=WAIT_S) as response:
        lines = [line for line in response.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event:")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    assert names == [d["type"] for d in data]  # named events, and no [DONE]


def test_the_client_s_stream_helper_reads_a_completed_response(client: openai.OpenAI) -> None:
    """A schema's grammar closes the answer within its budget: the response completes."""
    args: dict[str, Any] = {"model": MODEL, "input": QUESTION, "max_output_tokens": 64}
    whole = client.responses.create(**args, text={"format": SCHEMA_FORMAT})
    value = json.loads(whole.output_text)
    assert set(value) >= {"a", "b", "c"} and value["b"] in ("xy", "zw")
    assert whole.status == "completed" and whole.incomplete_details is None
    assert whole.text.format.type == "json_schema"
    with client.responses.stream(**args, text={"format": SCHEMA_FORMAT}) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert squeezed(types) == [*TEXT_EVENTS, "response.completed"]
    assert final.output_text == whole.output_text
    response_format = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL_SCHEMA}}
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=64,
        response_format=response_format,
    )
    assert chat.choices[0].message.content == whole.output_text


def test_json_object_and_text_formats(client: openai.OpenAI) -> None:
    out = client.responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=32, text={"format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(out.output_text), dict)
    plain = client.responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=8, text={"format": {"type": "text"}}
    )
    assert (
        plain.output_text
        == client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8).output_text
    )


# ---------------------------------------------------------------------------- tools


def test_a_forced_call_is_the_chat_route_s_call(tools_client: openai.OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL,
        "input": "Weather?",
        "tools": [FLAT_CITY],
        "max_output_tokens": 120,
    }
    out = tools_client.responses.create(**args, tool_choice="required")
    (call,) = out.output
    assert call.type == "function_call" and call.name == "get_weather" and out.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome") and call.call_id
    assert out.tools[0].name == "get_weather" and out.tool_choice == "required"
    chat = tools_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[CITY],
        tool_choice="required",
        max_tokens=120,
    )
    (chat_call,) = chat.choices[0].message.tool_calls
    assert (chat_call.function.name, chat_call.function.arguments) == (call.name, call.arguments)
    named = {"type": "function", "name": "get_weather"}
    with tools_client.responses.stream(**args, tool_choice=named) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (streamed,) = final.output
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)


def test_a_call_s_round_trip_is_the_chat_conversation(tools_client: openai.OpenAI) -> None:
    """A ``function_call`` item and its ``function_call_output`` are the assistant's call and
    the tool's message: the answer is the chat route's to those messages."""
    arguments = '{"city": "Paris"}'
    out = tools_client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
        ],
        tools=[FLAT_CITY],
        max_output_tokens=16,
    )
    chat = tools_client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
        ],
        tools=[CITY],
        max_tokens=16,
    )
    message = chat.choices[0].message
    assert out.output_text == (message.content or "")
    calls = [(o.name, o.arguments) for o in out.output if o.type == "function_call"]
    assert calls == [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


# ---------------------------------------------------------------------------- errors


def bad_request(client: openai.OpenAI, **args: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, **args)
    return info.value


@pytest.mark.parametrize(
    ("args", "param", "code"),
    [
        ({"store": True}, "store", "unsupported_value"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"extra_body": {"bogus": 1}}, "bogus", "unknown_parameter"),
        ({"extra_body": {"messages": [{"role": "user", "content": "Hi"}]}}, "messages", "unknown_parameter"),
        ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_value"),
        ({"truncation": "auto"}, "truncation", "unsupported_value"),
        ({"background": True}, "background", "unsupported_value"),
        ({"temperature": 5}, "temperature", None),
        ({"max_output_tokens": 0}, "max_output_tokens", None),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value"),
        ({"tools": [CITY]}, "tools[0].function", None),  # the chat shape is not this route's
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", None),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", None),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}},
            "text.format.schema",
            None,
        ),
        ({"text": {"verbosity": "low"}}, "text.verbosity", None),
        ({"extra_body": {"documents": "one"}}, "documents", None),
    ],
)
def test_what_cannot_be_honoured_is_400_naming_the_parameter(
    client: openai.OpenAI, args: dict[str, Any], param: str | None, code: str | None
) -> None:
    error = bad_request(client, **{"input": QUESTION, **args})
    assert error.param == param and (code is None or error.code == code), error.body


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([], "input"),
        ([{"type": "reasoning", "id": "rs_1", "summary": []}], "input[0].type"),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"role": "critic", "content": "Hi"}], "input[0].role"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0].content[0]"),
        ([{"role": "user", "content": "Hi", "mood": "ok"}], "input[0].mood"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}], "input[0].arguments"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}], "input[0].arguments"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c"}], "input[0].output"),
    ],
)
def test_bad_input_items_are_400_naming_the_item(client: openai.OpenAI, items: list[Any], param: str) -> None:
    assert bad_request(client, input=items).param == param


def test_tools_on_a_template_without_them_are_400(client: openai.OpenAI) -> None:
    error = bad_request(client, input="Weather?", tools=[FLAT_CITY])
    assert (error.code, error.param) == ("tools_not_supported", "tools")


def test_a_failure_while_generating_answers_its_request_alone(client: openai.OpenAI) -> None:
    dead = {"type": "json_schema", **DEAD_END_FORMAT["json_schema"]}
    args: dict[str, Any] = {
        "model": MODEL,
        "input": QUESTION,
        "max_output_tokens": N,
        "text": {"format": dead},
    }
    with pytest.raises(openai.InternalServerError, match="dead end"):
        client.responses.create(**args)
    with pytest.raises(openai.APIError, match="dead end"):  # the error event, as on chat
        for _ in client.responses.create(**args, stream=True):
            pass
    assert client.responses.create(model=MODEL, input="Still here", max_output_tokens=4).output_text


LONE = "\\ud800"  # a lone surrogate as JSON escapes it: valid JSON, no valid text
# Hostile bodies, raw: (body, status, code, param).
HOSTILE: list[tuple[str, int, str | None, str | None]] = [
    ('{"input": ' + "[" * 50_000 + "]" * 50_000 + "}", 400, "invalid_json", None),
    ('{"input": "Hi", "max_output_tokens": 1' + "0" * 5000 + "}", 400, "invalid_json", None),
    ("[1, 2]", 400, None, None),
    ('{"input": "a' + LONE + '"}', 400, None, "input"),
    ('{"input": "Hi", "instructions": "' + LONE + '"}', 400, None, "instructions"),
    (
        '{"input": [{"role": "user", "content": [{"type": "input_text", "text": "' + LONE + '"}]}]}',
        400,
        None,
        "input[0].content[0].text",
    ),
    (
        '{"input": [{"type": "function_call_output", "call_id": "c", "output": "' + LONE + '"}]}',
        400,
        None,
        "input[0].output",
    ),
    (
        '{"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\\"'
        + LONE
        + '\\": 1}"}]}',
        400,
        None,
        "input[0].arguments",
    ),
    ('{"input": "Hi", "documents": ["' + LONE + '"]}', 400, None, "documents[0]"),
    (
        '{"input": "Hi", "tools": [{"type": "function", "name": "f", "description": "' + LONE + '"}]}',
        400,
        None,
        "tools",
    ),
    ('{"input": "Hi", "model": 7}', 400, None, "model"),
    ('{"input": "Hi", "foo": null}', 400, "unknown_parameter", "foo"),  # null or not: unknown
    ('{"input": "Hi", "model": "gpt-4o"}', 404, "model_not_found", "model"),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), HOSTILE)
def test_hostile_bodies_are_the_client_s_error(
    live: LiveServer, body: str, status: int, code: str | None, param: str | None
) -> None:
    response = httpx.post(f"{live.base_url}/responses", content=body.encode(), timeout=WAIT_S)
    error = error_of(response, status)
    assert (code is None or error["code"] == code) and error["param"] == param, error
    assert httpx.get(f"{live.url}/health").status_code == 200


def test_the_route_is_behind_chat_s_walls(engine: LookaheadEngine) -> None:
    """The API key, the body limit and admission are the chat route's."""
    app = create_app(
        engine, ServeSettings(model_name=MODEL, api_key="key", max_body_bytes=1000, max_waiting=0)
    )
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 2}
    auth = {"Authorization": "Bearer key"}

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            error_of(await http.post("/v1/responses", json=body), 401)
            big = {**body, "input": "x" * 2000}
            error_of(await http.post("/v1/responses", json=big, headers=auth), 413)
            slots = [
                await app.state.lookahead.admission.enter()
                for _ in range(app.state.lookahead.settings.max_running)
            ]
            error_of(await http.post("/v1/responses", json=body, headers=auth), 429)
            for slot in slots:
                slot.release()
            assert (await http.post("/v1/responses", json=body, headers=auth)).status_code == 200

    asyncio.run(run())
