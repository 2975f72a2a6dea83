"""Tool calls for `LookaheadLLM`: LlamaIndex's side.

The core plans a call's tools (`rag_lookahead.protocol`: the checked tools, the normalised
``tool_choice``, the model's tool format and the grammar of a forced call) and streams the
reply up to where a call may begin (`HeldReply`); here LlamaIndex's side: its tools as
OpenAI-style dicts, its chat messages with their calls and results, tool calls in responses
(``additional_kwargs["tool_calls"]`` in OpenAI's shape, as LlamaIndex's OpenAI LLM keeps
them, so that an agent's history round-trips) and `ToolSelection` s for agents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools.types import BaseTool

from llama_index.llms.rag_lookahead.responses import chat_response
from rag_lookahead import protocol

__all__ = [
    "ToolPlan",
    "last_tool_response",
    "message_dict",
    "openai_tools",
    "tool_response",
    "tool_selections",
]


@dataclass(frozen=True)
class ToolPlan(protocol.ToolPlan):
    """The core's tool plan of a chat call, and LlamaIndex's ``allow_parallel_tool_calls``.

    Attributes:
        single: Keep only the first call (``allow_parallel_tool_calls=False``).
    """

    single: bool = False


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LlamaIndex tools (or OpenAI-style tool dicts) as OpenAI-style tool dicts (the core
    checks them)."""
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
    return converted


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


def last_tool_response(plan: ToolPlan, text: str, shown: str, extra: dict[str, Any]) -> ChatResponse:
    """The last streamed response of a reply that may call tools, ``shown`` of it already
    streamed: held-back text that turned out to be content is its delta."""
    response = tool_response(text, plan, "", extra)
    content = response.message.content or ""
    response.delta = content[len(shown) :] if content.startswith(shown) else ""
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
