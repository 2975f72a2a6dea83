"""`LookaheadLLM` as a LlamaIndex `FunctionCallingLLM` and structured-output LLM, on the real
default model: forced calls parse against the tool's schema, structured replies against the
output class's, and both are the text of plain decoding under the same grammar."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.bridge.pydantic import BaseModel, Field
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool

from llama_index.llms.rag_lookahead import LookaheadLLM, StructuredOutputError
from llama_index.llms.rag_lookahead.tools import ToolPlan, tool_response
from rag_lookahead.structured import ToolFormat

QUESTION = "Who did Rollo sign the treaty of Saint-Clair-sur-Epte with?"


class SearchArgs(BaseModel):
    query: str = Field(description="A few words to look up", max_length=40)


def search(query: str) -> str:
    return "Rollo signed the treaty with King Charles III of West Francia in 911."


class Person(BaseModel):
    name: str
    age: int


TOOL = FunctionTool.from_defaults(
    search, name="search", description="Search the articles.", fn_schema=SearchArgs
)
EXTRACT = PromptTemplate("Extract the person from this text: {text}")


@pytest.fixture(scope="module")
def tool_llm(llm: LookaheadLLM) -> LookaheadLLM:
    return LookaheadLLM(engine=llm.engine, max_new_tokens=40)


@pytest.fixture(scope="module")
def plain_tool_llm(llm: LookaheadLLM) -> LookaheadLLM:
    return LookaheadLLM(engine=llm.engine, max_new_tokens=40, lookahead=False)


def test_is_a_function_calling_llm(tool_llm: LookaheadLLM) -> None:
    assert FunctionCallingLLM in LookaheadLLM.__mro__
    assert tool_llm.metadata.is_function_calling_model


@pytest.mark.parametrize("choice", [{"tool_required": True}, {"tool_choice": "search"}])
def test_forced_call_parses_against_the_schema_and_is_plain_constrained_decoding(
    tool_llm: LookaheadLLM, plain_tool_llm: LookaheadLLM, choice: dict[str, Any]
) -> None:
    response = tool_llm.chat_with_tools([TOOL], user_msg=QUESTION, **choice)
    reference = plain_tool_llm.chat_with_tools([TOOL], user_msg=QUESTION, **choice)

    assert response.message.content == reference.message.content
    assert response.message.additional_kwargs == {
        **reference.message.additional_kwargs,
        "tool_calls": [
            {**c, "id": mine["id"]}
            for c, mine in zip(
                reference.message.additional_kwargs["tool_calls"],
                response.message.additional_kwargs["tool_calls"],
                strict=True,
            )
        ],
    }
    (selection,) = tool_llm.get_tool_calls_from_response(response)
    assert selection.tool_name == "search" and selection.tool_id.startswith("call_")
    SearchArgs.model_validate(selection.tool_kwargs)  # within the schema, length bound included
    assert response.additional_kwargs["lookahead"]["new_tokens"] > 0


def test_round_trip_with_the_tool_result(tool_llm: LookaheadLLM) -> None:
    call = tool_llm.chat_with_tools([TOOL], user_msg=QUESTION, tool_required=True)
    (selection,) = tool_llm.get_tool_calls_from_response(call)
    result = ChatMessage(
        role=MessageRole.TOOL,
        content=TOOL(**selection.tool_kwargs).content,
        additional_kwargs={"tool_call_id": selection.tool_id, "name": "search"},
    )
    history = [ChatMessage(role=MessageRole.USER, content=QUESTION), call.message, result]
    prompt = tool_llm._chat_prompt(history)
    assert prompt[1]["tool_calls"][0]["id"] == selection.tool_id
    assert prompt[2] == {
        "role": "tool",
        "content": result.content,
        "tool_call_id": selection.tool_id,
        "name": "search",
    }
    answer = tool_llm.chat_with_tools([TOOL], chat_history=history, tool_choice="none")
    assert answer.message.content and not answer.message.additional_kwargs.get("tool_calls")


def test_streamed_and_async_calls(tool_llm: LookaheadLLM) -> None:
    blocking = tool_llm.chat_with_tools([TOOL], user_msg=QUESTION, tool_required=True)
    responses = list(tool_llm.stream_chat_with_tools([TOOL], user_msg=QUESTION, tool_required=True))
    last = responses[-1]
    assert last.delta == "" and "lookahead" in last.additional_kwargs
    assert [s.tool_kwargs for s in tool_llm.get_tool_calls_from_response(last)] == [
        s.tool_kwargs for s in tool_llm.get_tool_calls_from_response(blocking)
    ]
    # The call's text is held back: no delta shows its markup.
    assert "".join(r.delta or "" for r in responses) == (last.message.content or "")

    async def both() -> tuple[ChatResponse, list[ChatResponse]]:
        one = await tool_llm.achat_with_tools([TOOL], user_msg=QUESTION, tool_required=True)
        gen = await tool_llm.astream_chat_with_tools([TOOL], user_msg=QUESTION, tool_required=True)
        return one, [r async for r in gen]

    one, streamed = asyncio.run(both())
    for response in (one, streamed[-1]):
        assert (
            response.message.additional_kwargs["tool_calls"][0]["function"]
            == (blocking.message.additional_kwargs["tool_calls"][0]["function"])
        )


def test_auto_and_none(tool_llm: LookaheadLLM, plain_tool_llm: LookaheadLLM) -> None:
    auto = tool_llm.chat_with_tools([TOOL], user_msg="Say hello.")
    assert (
        auto.message.content == plain_tool_llm.chat_with_tools([TOOL], user_msg="Say hello.").message.content
    )
    none = tool_llm.chat_with_tools([TOOL], user_msg="Say hello.", tool_choice="none")
    plain_chat = tool_llm.chat([ChatMessage(role=MessageRole.USER, content="Say hello.")])
    assert none.message.content == plain_chat.message.content  # no tools in the prompt
    assert tool_llm.get_tool_calls_from_response(none, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="expected at least one tool call"):
        tool_llm.get_tool_calls_from_response(none)


def test_a_cut_call_is_reported_not_guessed(tool_llm: LookaheadLLM) -> None:
    response = tool_llm.chat_with_tools([TOOL], user_msg=QUESTION, tool_required=True, max_new_tokens=6)
    assert "tool_calls" not in response.message.additional_kwargs
    assert response.message.content and response.message.content.startswith("<tool_call>")
    assert response.message.additional_kwargs["tool_call_errors"]
    assert tool_llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="did not parse"):
        tool_llm.get_tool_calls_from_response(response)


def test_parallel_calls_and_their_parsing() -> None:
    fmt = ToolFormat.named("smollm2")
    text = (
        'Looking. <tool_call>[{"name": "search", "arguments": {"query": "a"}}, '
        '{"name": "search", "arguments": {"query": "b"}}]</tool_call>'
    )
    both = tool_response(text, ToolPlan(format=fmt), None, {})
    assert both.message.content == "Looking."
    assert [c["function"]["arguments"] for c in both.message.additional_kwargs["tool_calls"]] == [
        {"query": "a"},
        {"query": "b"},
    ]
    first = tool_response(text, ToolPlan(format=fmt, single=True), None, {})
    assert len(first.message.additional_kwargs["tool_calls"]) == 1
    json_args = ChatResponse(
        message=ChatMessage(
            role=MessageRole.ASSISTANT,
            additional_kwargs={
                "tool_calls": [{"id": "x", "function": {"name": "search", "arguments": '{"query": "c"}'}}]
            },
        )
    )
    (selection,) = LookaheadLLM.get_tool_calls_from_response(None, json_args)  # type: ignore[arg-type]
    assert selection.tool_kwargs == {"query": "c"}


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"tool_choice": "missing"}, ValueError, "tool_choice is"),
        ({"tool_choice": 3}, ValueError, "tool_choice is"),
        ({"tool_choice": "none", "tool_required": True}, ValueError, "forbids"),
        ({"tools": [], "tool_choice": "required"}, ValueError, "no tools are given"),
        ({"tools": "search"}, TypeError, "sequence of tools"),
        ({"tools": [object()]}, TypeError, "LlamaIndex tool"),
        ({"tools": [TOOL, TOOL]}, ValueError, "unique"),
        ({"tool_choice": "required", "grammar": object()}, TypeError, "own grammar"),
    ],
)
def test_bad_tool_options(tool_llm: LookaheadLLM, options: dict[str, Any], error: type, match: str) -> None:
    kwargs = {"tools": [TOOL], **options}
    with pytest.raises(error, match=match):
        tool_llm.chat([ChatMessage(role=MessageRole.USER, content=QUESTION)], **kwargs)


def test_tools_need_a_chat_call(tool_llm: LookaheadLLM) -> None:
    with pytest.raises(TypeError, match="unexpected keyword"):
        tool_llm.complete(QUESTION, tools=[TOOL])


# ---------------------------------------------------------------------------- structured output


def test_structured_predict_is_plain_constrained_decoding(
    tool_llm: LookaheadLLM, plain_tool_llm: LookaheadLLM
) -> None:
    person = tool_llm.structured_predict(Person, EXTRACT, text="Alice is 31 years old.")
    assert isinstance(person, Person)
    assert person == plain_tool_llm.structured_predict(Person, EXTRACT, text="Alice is 31 years old.")
    again = asyncio.run(tool_llm.astructured_predict(Person, EXTRACT, text="Alice is 31 years old."))
    assert again == person


def test_stream_structured_predict(tool_llm: LookaheadLLM) -> None:
    parts = list(tool_llm.stream_structured_predict(Person, EXTRACT, text="Bob is 40 years old."))
    assert isinstance(parts[-1], Person) and len(parts) > 2
    assert parts[-1] == tool_llm.structured_predict(Person, EXTRACT, text="Bob is 40 years old.")

    async def collect() -> list[Any]:
        gen = await tool_llm.astream_structured_predict(Person, EXTRACT, text="Bob is 40 years old.")
        return [p async for p in gen]

    assert asyncio.run(collect())[-1] == parts[-1]


def test_as_structured_llm(tool_llm: LookaheadLLM) -> None:
    structured = tool_llm.as_structured_llm(Person)
    response = structured.chat([ChatMessage(role=MessageRole.USER, content="Carol is 25.")])
    assert Person.model_validate(json.loads(response.message.content or "")) == response.raw


def test_cut_structured_reply_raises(tool_llm: LookaheadLLM) -> None:
    with pytest.raises(StructuredOutputError, match="max_new_tokens"):
        tool_llm.structured_predict(Person, EXTRACT, llm_kwargs={"max_new_tokens": 3}, text="Dan is 50.")
    with pytest.raises(TypeError, match="own grammar"):
        tool_llm.structured_predict(Person, EXTRACT, llm_kwargs={"grammar": None}, text="Dan is 50.")
    with pytest.raises(TypeError, match="pydantic model class"):
        tool_llm.structured_predict(dict, EXTRACT, text="Dan is 50.")  # type: ignore[type-var]
