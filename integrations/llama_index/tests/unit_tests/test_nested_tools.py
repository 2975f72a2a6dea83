"""Tools and structured output of nested pydantic models (``$defs`` and refs, as LlamaIndex's
tools write them), on the tiny model with the default model's tool template: forced calls by
name, ``"required"`` and ``tool_required``, a function-calling program, structured output and a
`FunctionAgent` run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.program import FunctionCallingProgram
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool

from llama_index.llms.rag_lookahead import LookaheadLLM
from rag_lookahead.testing import nested_person, packaged_template, tiny_tool_engine

TEMPLATE = packaged_template()
QUESTION = "Save Ann, of Caen."


Person = nested_person()


def save_person(**person: Any) -> str:
    """Save a person."""
    return f"saved {Person.model_validate(person).name!r}"  # a function tool gets plain JSON


TOOL = FunctionTool.from_defaults(save_person, name="save_person", fn_schema=Person)
assert TOOL.metadata.to_openai_tool()["function"]["parameters"]["properties"]["address"] == {
    "$ref": "#/$defs/Address"
}


@pytest.fixture(scope="module")
def tool_llm() -> LookaheadLLM:
    return LookaheadLLM(engine=tiny_tool_engine(TEMPLATE), max_new_tokens=300)


@pytest.mark.parametrize(
    "choice", [{"tool_required": True}, {"tool_choice": "required"}, {"tool_choice": "save_person"}]
)
def test_a_forced_call_to_a_tool_of_nested_models_is_a_valid_call(
    tool_llm: LookaheadLLM, choice: dict[str, Any]
) -> None:
    response = tool_llm.chat_with_tools([TOOL], user_msg=QUESTION, **choice)
    (selection,) = tool_llm.get_tool_calls_from_response(response)
    assert selection.tool_name == "save_person"
    Person.model_validate(selection.tool_kwargs)


def test_a_function_calling_program_of_nested_models(tool_llm: LookaheadLLM) -> None:
    program = FunctionCallingProgram.from_defaults(
        output_cls=Person, llm=tool_llm, prompt_template_str="Extract the person: {text}"
    )
    assert isinstance(program(text=QUESTION), Person)


def test_structured_predict_of_nested_models(tool_llm: LookaheadLLM) -> None:
    person = tool_llm.structured_predict(Person, PromptTemplate("Extract the person: {text}"), text=QUESTION)
    assert isinstance(person, Person) and person.address.city


def test_a_function_agent_calls_a_tool_of_nested_models(tool_llm: LookaheadLLM) -> None:
    """The agent of examples/llamaindex_agent.py (its first turn forced), with a nested-model
    tool and a nested output class."""
    agent = FunctionAgent(tools=[TOOL], llm=tool_llm, initial_tool_choice="save_person", output_cls=Person)

    async def run() -> tuple[list[ToolCallResult], Any]:
        handler = agent.run(user_msg=QUESTION, max_iterations=3)
        results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
        return results, await handler

    results, output = asyncio.run(run())
    (result,) = results
    assert result.tool_name == "save_person" and not result.tool_output.is_error
    assert result.tool_output.content.startswith("saved ")
    Person.model_validate(result.tool_kwargs)
    Person.model_validate(output.structured_response)
