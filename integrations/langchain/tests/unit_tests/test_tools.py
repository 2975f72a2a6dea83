"""Tool calls and structured output of nested pydantic models (``$defs`` and refs), on the tiny
model with the default model's tool template: forced calls (by name, ``"any"``,
``"required"``), ``with_structured_output``, a LangGraph agent, and a forced call cut by
``max_tokens``."""

from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel, ConfigDict, Field

from langchain_rag_lookahead import ChatLookahead
from rag_lookahead import LookaheadEngine
from rag_lookahead.testing import nested_person, packaged_template, tiny_tool_engine

TEMPLATE = packaged_template()
QUESTION = "Save Ann, of Caen."


Person = nested_person()
Address = Person.model_fields["address"].annotation


class Place(BaseModel):  # another "Address", once renamed: a post code, no city
    model_config = ConfigDict(extra="forbid")
    code: str = Field(max_length=5)


class Parcel(BaseModel):
    address: Place


def function(name: str, model: type[BaseModel], rename: dict[str, str] | None = None) -> dict[str, Any]:
    """An OpenAI-style tool whose parameters are ``model``'s schema as pydantic writes it (LangChain
    inlines a pydantic tool's refs, not those of a tool given as a dict)."""
    schema = model.model_json_schema()
    for old, new in (rename or {}).items():
        schema["$defs"][new] = schema["$defs"].pop(old)
        schema = _renamed_refs(schema, f"#/$defs/{old}", f"#/$defs/{new}")
    return {"type": "function", "function": {"name": name, "description": "A tool.", "parameters": schema}}


def _renamed_refs(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: new if k == "$ref" and v == old else _renamed_refs(v, old, new) for k, v in value.items()}
    return [_renamed_refs(v, old, new) for v in value] if isinstance(value, list) else value


SAVE = function("save_person", Person)
assert SAVE["function"]["parameters"]["properties"]["address"] == {"$ref": "#/$defs/Address"}
SEND = function("send_parcel", Parcel, {"Place": "Address"})  # the same def name, another model
MODELS = {"save_person": Person, "send_parcel": Parcel}


@pytest.fixture(scope="module")
def tool_engine() -> LookaheadEngine:
    return tiny_tool_engine(TEMPLATE)


def chat(engine: LookaheadEngine, max_tokens: int = 300) -> ChatLookahead:
    return ChatLookahead(engine=engine, max_tokens=max_tokens)


@pytest.mark.parametrize(
    "choice", ["save_person", "any", "required", {"type": "function", "function": {"name": "save_person"}}]
)
def test_a_forced_call_to_a_tool_of_nested_models_is_a_valid_call(tool_engine, choice: object) -> None:
    reply = chat(tool_engine).bind_tools([SAVE], tool_choice=choice).invoke(QUESTION)
    assert isinstance(reply, AIMessage) and not reply.invalid_tool_calls
    (call,) = reply.tool_calls
    assert call["name"] == "save_person"
    Person.model_validate(call["args"])


def test_tools_whose_definitions_share_a_name_keep_their_own(tool_engine) -> None:
    reply = chat(tool_engine).bind_tools([SAVE, SEND], tool_choice="any").invoke(QUESTION)
    (call,) = reply.tool_calls
    MODELS[call["name"]].model_validate(call["args"])
    for name in MODELS:
        (call,) = chat(tool_engine).bind_tools([SAVE, SEND], tool_choice=name).invoke(QUESTION).tool_calls
        MODELS[name].model_validate(call["args"])


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
@pytest.mark.parametrize("schema", [Person, Person.model_json_schema()], ids=["pydantic", "dict"])
def test_structured_output_of_nested_models(tool_engine, method: str, schema: Any) -> None:
    structured = chat(tool_engine).with_structured_output(schema, method=method)  # type: ignore[arg-type]
    result = structured.invoke(QUESTION)
    person = result if isinstance(result, Person) else Person.model_validate(result)
    assert person.address.city
    assert [*structured.stream(QUESTION)][-1] == result


@pytest.mark.parametrize("schema", [Person, Person.model_json_schema()], ids=["pydantic", "dict"])
def test_a_forced_call_cut_by_max_tokens_is_a_parser_error(tool_engine, schema: Any) -> None:
    # As LangChain's own chat models do for a call cut off: an error, not None.
    llm = chat(tool_engine, max_tokens=40)
    with pytest.raises(OutputParserException, match="no complete call to 'Person' \\(cut by max_tokens"):
        llm.with_structured_output(schema, method="function_calling").invoke(QUESTION)
    result = llm.with_structured_output(schema, method="function_calling", include_raw=True).invoke(QUESTION)
    assert result["parsed"] is None
    assert isinstance(result["parsing_error"], OutputParserException)
    assert result["raw"].invalid_tool_calls and not result["raw"].tool_calls


def save_person(name: str, address: Address, previous: list[Address], billing: Address | None = None) -> str:
    """Save a person."""
    return f"saved {type(address).__name__} in {len(previous)} + 1 places"


def test_a_langgraph_agent_calls_a_tool_of_nested_models(tool_engine) -> None:
    """The agent of examples/langgraph_agent.py (its first turn forced), with a nested-model tool."""
    tool = StructuredTool.from_function(save_person, args_schema=Person, name="save_person")
    llm = chat(tool_engine)
    call = llm.bind_tools([SAVE], tool_choice="any")
    answer = llm.bind_tools([SAVE], tool_choice="none", max_tokens=8)

    def model(state: MessagesState) -> dict[str, list[Any]]:
        called = any(isinstance(m, ToolMessage) for m in state["messages"])
        return {"messages": [(answer if called else call).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    messages = graph.compile().invoke({"messages": [HumanMessage(QUESTION)]})["messages"]
    _, called, result, answered = messages
    assert called.tool_calls[0]["name"] == "save_person"
    assert isinstance(result, ToolMessage) and result.status == "success"
    assert result.content.startswith("saved Address in ")
    assert isinstance(answered, AIMessage) and not answered.tool_calls
