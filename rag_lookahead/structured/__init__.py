"""Constrained answers: grammars (JSON schemas, regular expressions) the engine decodes under,
and tool calls in a model's own format."""

from rag_lookahead.structured.grammar import Grammar, GrammarKind
from rag_lookahead.structured.tools import (
    InvalidToolCall,
    ParsedReply,
    ToolCall,
    ToolFormat,
    ToolFormatName,
    ToolsNotSupportedError,
    check_tools,
    detect_tool_format,
    tool_choice,
)

__all__ = [
    "Grammar",
    "GrammarKind",
    "InvalidToolCall",
    "ParsedReply",
    "ToolCall",
    "ToolFormat",
    "ToolFormatName",
    "ToolsNotSupportedError",
    "check_tools",
    "detect_tool_format",
    "tool_choice",
]
