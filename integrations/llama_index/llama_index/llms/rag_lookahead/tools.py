"""Tool calls and structured output for `LookaheadLLM`: LlamaIndex's side.

The core (`rag_lookahead.structured.tools`) renders tools through the chat template, reads the
model's tool format and builds the grammar of a forced call; here LlamaIndex's side: its tools
and ``tool_choice`` / ``tool_required``, tool calls in responses (``additional_kwargs
["tool_calls"]`` in OpenAI's shape, as LlamaIndex's OpenAI LLM keeps them, so that an agent's
history round-trips), `ToolSelection` s for agents, and replies held to a pydantic model's
schema.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.bridge.pydantic import BaseModel, ValidationError
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.llms.utils import parse_partial_json
from llama_index.core.program.utils import FlexibleModel, create_flexible_model
from llama_index.core.tools.types import BaseTool

from llama_index.llms.rag_lookahead.responses import chat_response, usage
from rag_lookahead import Completion, TextStream
from rag_lookahead.interface import Engine
from rag_lookahead.streaming import aiterate
from rag_lookahead.structured import Grammar, ToolFormat, check_tools, detect_tool_format
from rag_lookahead.structured import tool_choice as normalised_choice

__all__ = [
    "StructuredOutputError",
    "ToolPlan",
    "atool_responses",
    "message_dict",
    "parse_structured",
    "partial_structured",
    "schema_grammar",
    "tool_plan",
    "tool_response",
    "tool_responses",
    "tool_selections",
]

Model = TypeVar("Model", bound=BaseModel)


class StructuredOutputError(ValueError):
    """A structured reply that does not parse against its schema (cut by ``max_new_tokens``)."""


@dataclass(frozen=True)
class ToolPlan:
    """What one chat call does with tools.

    Attributes:
        tools: OpenAI-style tools the chat template renders (none: a plain call).
        grammar: The grammar of a forced call (``tool_choice`` ``"required"`` or a name).
        format: The model's tool format, when the reply is to be parsed for calls.
        single: Keep only the first call (``allow_parallel_tool_calls=False``).
    """

    tools: tuple[dict[str, Any], ...] = ()
    grammar: Grammar | None = None
    format: ToolFormat | None = None
    single: bool = False

    def stream_kwargs(self) -> dict[str, Any]:
        """What ``engine.stream`` takes for this plan besides the prompt."""
        return {"tools": list(self.tools)} if self.tools else {}


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LlamaIndex tools (or OpenAI-style tool dicts) as checked OpenAI-style tools."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools are a sequence of tools, got {type(tools).__name__}")
    converted = []
    for tool in tools:
        if isinstance(tool, BaseTool):
            converted.append(tool.metadata.to_openai_tool())
        elif isinstance(tool, Mapping):
            converted.append(dict(tool))
        else:
            raise TypeError(f"a tool is a LlamaIndex tool or an OpenAI-style dict, got {type(tool).__name__}")
    return check_tools(converted)


def tool_plan(
    engine: Engine,
    tools: Sequence[Any] | None,
    tool_choice: object = None,
    tool_required: bool = False,
    allow_parallel_tool_calls: bool = True,
) -> ToolPlan:
    """The plan for a call given these tool options, or a clear error.

    ``tool_choice``: ``None`` / ``"auto"`` (the model decides; its reply is parsed for calls),
    ``"required"`` / ``"any"`` (one call to one of the tools, forced by a grammar), a tool's
    name or ``{"type": "function", "function": {"name": ...}}`` (one call to it, forced), or
    ``"none"`` (no tools in the prompt). ``tool_required=True`` makes ``None`` / ``"auto"``
    ``"required"``.
    """
    checked = openai_tools(tools or [])
    names = [t["function"]["name"] for t in checked]
    choice = _choice(tool_choice, tool_required, names)
    if not checked or choice == "none":
        return ToolPlan()
    fmt = _tool_format(engine)
    grammar = None if choice == "auto" else fmt.grammar(checked, None if choice == "any" else choice)
    return ToolPlan(tuple(checked), grammar, fmt, single=not allow_parallel_tool_calls)


def _choice(choice: object, tool_required: bool, names: list[str]) -> str:
    normalised = normalised_choice(choice, names)
    if not tool_required or normalised not in ("auto", "none"):
        return normalised
    if normalised == "none":
        raise ValueError("tool_required=True forces a tool call; tool_choice='none' forbids one")
    return normalised_choice("any", names)


def _tool_format(engine: Engine) -> ToolFormat:
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        raise NotImplementedError(
            f"tool calling needs a local engine (the model's chat template); {type(engine).__name__} has none"
        )
    return detect_tool_format(tokenizer, getattr(engine, "chat_template_kwargs", None))


# ---------------------------------------------------------------------------- messages


def message_dict(message: ChatMessage, role: str) -> dict[str, Any]:
    """A chat message for the chat template, with an assistant's ``tool_calls`` and a tool
    result's ``tool_call_id`` (and tool ``name``) from its ``additional_kwargs``."""
    out: dict[str, Any] = {"role": role, "content": message.content or ""}
    extra = message.additional_kwargs
    if message.role == MessageRole.ASSISTANT and extra.get("tool_calls"):
        out["tool_calls"] = [_call_dict(c) for c in extra["tool_calls"]]
    if message.role == MessageRole.TOOL:
        for key in ("tool_call_id", "name"):
            if extra.get(key):
                out[key] = str(extra[key])
    return out


def _call_dict(call: Any) -> Any:
    """A tool call as a mapping (OpenAI's client objects have ``model_dump``)."""
    return call.model_dump() if hasattr(call, "model_dump") else call


# ---------------------------------------------------------------------------- replies


def tool_response(text: str, plan: ToolPlan, delta: str | None, extra: dict[str, Any]) -> ChatResponse:
    """The response to a whole reply: its content and the calls it made.

    Calls go to ``additional_kwargs["tool_calls"]``; a call block that does not parse (cut by
    ``max_new_tokens``, malformed) leaves the reply's whole text as the content and its error
    in ``additional_kwargs["tool_call_errors"]``: nothing is guessed.
    """
    assert plan.format is not None
    reply = plan.format.parse(text)
    calls = reply.calls[:1] if plan.single else reply.calls
    fields = dict(extra)
    if reply.invalid:
        fields["tool_call_errors"] = [bad.error for bad in reply.invalid]
    if calls:
        fields["tool_calls"] = [call.as_message_call() for call in calls]
    content = reply.content if calls and not reply.invalid else text
    response = chat_response(content, delta, fields)
    response.message.additional_kwargs.update(
        {k: fields[k] for k in ("tool_calls", "tool_call_errors") if k in fields}
    )
    return response


def tool_responses(stream: TextStream, plan: ToolPlan) -> Generator[ChatResponse, None, None]:
    """Streamed responses of a reply that may call tools.

    Text that is surely content streams as it comes; from where a call may begin it is held
    back, and the last response (with the stats) carries the parsed calls.
    """
    assert plan.format is not None
    shown = 0
    with stream:
        for chunk in stream.chunks():
            if chunk.text:
                end = plan.format.content_end(stream.text)
                if end > shown:
                    yield chat_response(stream.text[:end], stream.text[shown:end], {})
                    shown = end
    yield _last(stream, plan, shown)


async def atool_responses(stream: TextStream, plan: ToolPlan) -> AsyncGenerator[ChatResponse, None]:
    """`tool_responses` for async callers (decoding runs in worker threads)."""
    assert plan.format is not None
    shown = 0
    async with aclosing(aiterate(stream.chunks())) as chunks:
        async for chunk in chunks:
            if chunk.text:
                end = plan.format.content_end(stream.text)
                if end > shown:
                    yield chat_response(stream.text[:end], stream.text[shown:end], {})
                    shown = end
    yield _last(stream, plan, shown)


def _last(stream: TextStream, plan: ToolPlan, shown: int) -> ChatResponse:
    response = tool_response(stream.text, plan, "", usage(stream.stats))
    content = response.message.content or ""
    # Held-back text that turned out to be content is the last delta.
    response.delta = content[shown:] if content.startswith(stream.text[:shown]) else ""
    return response


def tool_selections(response: ChatResponse, error_on_no_tool_call: bool = True) -> list[ToolSelection]:
    """The calls of ``response`` as LlamaIndex `ToolSelection` s.

    With ``error_on_no_tool_call``, a response without calls is a `ValueError`, naming the
    parse errors of a call that did not parse.
    """
    extra = response.message.additional_kwargs
    selections = []
    for call in extra.get("tool_calls") or []:
        function = _call_dict(call)["function"]
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        selections.append(
            ToolSelection(tool_id=_call_dict(call)["id"], tool_name=function["name"], tool_kwargs=arguments)
        )
    if not selections and error_on_no_tool_call:
        errors = extra.get("tool_call_errors")
        reason = f": the call did not parse ({'; '.join(errors)})" if errors else ""
        raise ValueError(f"expected at least one tool call in the response{reason}")
    return selections


# ---------------------------------------------------------------------------- structured output


def schema_grammar(output_cls: type[BaseModel]) -> Grammar:
    """The grammar of a JSON reply that validates against ``output_cls``'s schema."""
    if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
        raise TypeError(f"output_cls is a pydantic model class, got {output_cls!r}")
    return Grammar.json_schema(output_cls.model_json_schema())


def parse_structured(output_cls: type[Model], completion: Completion) -> Model:
    """``completion``'s text as an ``output_cls`` instance, or `StructuredOutputError` saying why."""
    try:
        return output_cls.model_validate_json(completion.text)
    except ValidationError as err:
        cut = completion.stats.finish_reason == "length"
        hint = " (cut by max_new_tokens: raise it)" if cut else ""
        raise StructuredOutputError(
            f"the reply is not a valid {output_cls.__name__}{hint}: {completion.text!r}; {err}"
        ) from None


def partial_structured(output_cls: type[BaseModel], text: str) -> FlexibleModel | None:
    """What of ``output_cls`` a reply decoded so far already holds (every field optional)."""
    try:
        value = parse_partial_json(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(value, dict):
        return None
    try:
        return create_flexible_model(output_cls).model_validate(value)
    except ValidationError:
        return None
