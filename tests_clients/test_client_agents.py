"""The OpenAI Agents SDK (openai-agents, unmodified) against the local server on 127.0.0.1:
an agent with a function tool, on its default model (the Responses API) and on its
chat-completions model.

The first turn forces the call (``tool_choice="required"``); the SDK runs the tool, sends its
output back, and the second turn (``tool_choice`` reset to the default, as the SDK does after
a call) answers in text. Both turns are the in-process engine's greedy replies to the same
messages and tools.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest

agents = pytest.importorskip("agents", reason="openai-agents is installed by `make test-clients`")

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem  # noqa: E402
from client_support import MODEL, chat_tool, in_process  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from rag_lookahead import LookaheadEngine  # noqa: E402
from rag_lookahead.testing.local_server import LiveServer  # noqa: E402

INSTRUCTIONS = "Answer with the weather."
QUESTION = "Weather in Paris?"
N = 120  # a forced call of the byte-level tiny model closes within it


@function_tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


TOOL = chat_tool(
    get_weather.name,
    get_weather.description,
    get_weather.params_json_schema,
    strict=get_weather.strict_json_schema,
)


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> None:
    set_tracing_disabled(True)


def agent(live: LiveServer, model_kind: str) -> Agent[Any]:
    client = AsyncOpenAI(base_url=live.base_url, api_key="none", max_retries=0)
    model_class = OpenAIResponsesModel if model_kind == "responses" else OpenAIChatCompletionsModel
    return Agent(
        name="weather",
        instructions=INSTRUCTIONS,
        tools=[get_weather],
        model=model_class(model=MODEL, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=N),
    )


def expected_run(engine: LookaheadEngine) -> tuple[tuple[str, str], str]:
    """The in-process call (name, arguments) of the first turn, and the second turn's text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
    ]
    (call,) = in_process(engine, messages, N, tools=[TOOL], tool_choice="required").calls
    arguments = json.dumps(dict(call.arguments))
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": call.name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": f"Sunny in {call.arguments['city']}"},
    ]
    return (call.name, arguments), in_process(engine, messages, N, tools=[TOOL]).content


def calls_and_outputs(items: list[Any]) -> tuple[list[tuple[str, dict[str, Any]]], list[Any]]:
    calls = [
        (item.raw_item.name, json.loads(item.raw_item.arguments))
        for item in items
        if isinstance(item, ToolCallItem)
    ]
    return calls, [item.output for item in items if isinstance(item, ToolCallOutputItem)]


@pytest.mark.parametrize("model_kind", ["responses", "chat_completions"])
def test_a_tool_call_then_the_answer(
    model_kind: str, tool_live: LiveServer, tool_engine: LookaheadEngine
) -> None:
    (name, arguments), answer = expected_run(tool_engine)
    result = Runner.run_sync(agent(tool_live, model_kind), QUESTION, max_turns=3)
    calls, outputs = calls_and_outputs(result.new_items)
    assert calls == [(name, json.loads(arguments))]
    assert outputs == [f"Sunny in {json.loads(arguments)['city']}"]
    assert result.final_output == answer


def test_a_streamed_run_is_the_whole_one(tool_live: LiveServer, tool_engine: LookaheadEngine) -> None:
    """The Responses model streams (`responses.stream`, which checks the events' order)."""
    (name, arguments), answer = expected_run(tool_engine)

    async def run() -> Any:
        streamed = Runner.run_streamed(agent(tool_live, "responses"), QUESTION, max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return streamed

    result = asyncio.run(run())
    calls, _ = calls_and_outputs(result.new_items)
    assert calls == [(name, json.loads(arguments))]
    assert result.final_output == answer
