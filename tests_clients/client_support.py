"""What the in-process engine answers to the chat request a client sends, for the tests here
to compare each client's answer with: the same messages, tools and grammar, no HTTP."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rag_lookahead import LookaheadEngine
from rag_lookahead.structured import Grammar, ParsedReply, detect_tool_format

__all__ = ["MODEL", "chat_tool", "in_process"]

MODEL = "tiny"  # the name the test servers serve their model under


def chat_tool(name: str, description: str, parameters: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A function tool in the chat shape (``extra``: ``strict``, as the client sends it)."""
    function = {"name": name, "description": description, "parameters": dict(parameters), **extra}
    return {"type": "function", "function": function}


def in_process(
    engine: LookaheadEngine,
    messages: Sequence[Mapping[str, Any]],
    max_new_tokens: int,
    *,
    tools: Sequence[Mapping[str, Any]] = (),
    tool_choice: str = "auto",
    schema: Mapping[str, Any] | None = None,
) -> ParsedReply:
    """The engine's greedy reply to ``messages``, split into text and calls as the server
    splits it: a forced call (``tool_choice`` ``"required"`` or a tool's name) under the tool
    format's grammar, ``schema`` under its JSON schema grammar."""
    grammar = Grammar.json_schema(dict(schema)).closing_in_budget() if schema is not None else None
    fmt = detect_tool_format(engine.tokenizer) if tools else None
    if fmt is not None and tool_choice != "auto":
        grammar = fmt.grammar(tools, None if tool_choice == "required" else tool_choice)
    text = engine.complete(
        list(messages), tools=list(tools) or None, max_new_tokens=max_new_tokens, grammar=grammar
    ).text
    return fmt.parse(text) if fmt is not None else ParsedReply(text)
