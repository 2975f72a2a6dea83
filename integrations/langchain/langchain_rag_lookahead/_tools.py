"""Tool calls and structured output for `ChatLookahead`.

The core (`rag_lookahead.structured.tools`) renders tools through the chat template, reads the
model's tool format and builds the grammar of a forced call; here LangChain's side: ``bind_tools``
arguments, call options, streamed ``tool_call_chunks`` and ``with_structured_output``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCallChunk
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.runnables import Runnable, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.json import parse_partial_json
from langchain_core.utils.pydantic import is_basemodel_subclass

from langchain_rag_lookahead._base import Piece, usage
from rag_lookahead import DecodeStats
from rag_lookahead.structured import Grammar, ParsedReply, ToolFormat, check_tools, detect_tool_format
from rag_lookahead.structured import tool_choice as normalised_choice

__all__ = ["BoundTools", "ToolRequest", "ToolStream", "structured_output", "tool_request"]


@dataclass(frozen=True)
class BoundTools:
    """Tools as OpenAI-style dicts and the normalised choice: ``auto``, ``any``, ``none`` or a name."""

    tools: list[dict[str, Any]]
    choice: str

    def encode_kwargs(self) -> dict[str, Any]:
        """What ``engine.encode`` / ``engine.stream`` take for these tools."""
        return {"tools": self.tools} if self.tools and self.choice != "none" else {}


def tool_request(tools: Sequence[Any], tool_choice: object, *, check: bool = True) -> BoundTools:
    """``bind_tools``' arguments converted and normalised, or a clear error.

    ``check=False`` (binding) leaves the full check of the tools (`check_tools`: names unique,
    schemas JSON) to the call, as other chat models do.
    """
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools are a sequence of tools, got {type(tools).__name__}")
    converted = [convert_to_openai_tool(t) for t in tools]
    if check:
        converted = check_tools(converted)
    return BoundTools(converted, normalised_choice(tool_choice, [t["function"]["name"] for t in converted]))


@dataclass(frozen=True)
class ToolRequest:
    """What one call does with tools and response formats.

    Attributes:
        prompt_tools: The tools the chat template renders, or ``None``.
        grammar: The reply's constraint: a forced tool call or a response format.
        format: The model's tool format when the reply is to be parsed for calls.
    """

    prompt_tools: list[dict[str, Any]] | None = None
    grammar: Grammar | None = None
    format: ToolFormat | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any], engine: Any) -> ToolRequest:
        """Pop ``tools``, ``tool_choice`` and ``response_format`` from a call's ``options``."""
        bound = tool_request(options.pop("tools", None) or [], options.pop("tool_choice", None))
        response_format = _response_format(options.pop("response_format", None))
        if not bound.encode_kwargs():
            return cls(grammar=response_format)
        if response_format is not None:
            raise ValueError("a call takes tools or a response_format, not both")
        template_kwargs = getattr(engine, "chat_template_kwargs", None)
        fmt = detect_tool_format(engine.tokenizer, template_kwargs)
        if bound.choice == "auto":
            return cls(bound.tools, None, fmt)
        return cls(
            bound.tools, fmt.grammar(bound.tools, None if bound.choice == "any" else bound.choice), fmt
        )


def _response_format(value: object) -> Grammar | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"response_format is a mapping such as {{'type': 'json_object'}}, got {value!r}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json()
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ValueError(
                "a json_schema response_format is {'type': 'json_schema', 'json_schema': {'schema': {...}}}"
            )
        return Grammar.json_schema(schema)
    raise ValueError(
        f"response_format is {{'type': 'text' | 'json_object' | 'json_schema', ...}}, got {value!r}"
    )


class ToolStream:
    """Turns an engine's pieces into chunks when the reply may hold tool calls.

    Text that is surely content streams as it comes; from where a call may begin, the text
    is held back and parsed when the reply ends, its calls sent as ``tool_call_chunks`` of the
    last chunk (a call that does not parse becomes an invalid tool call, never a guessed one).
    """

    def __init__(self, fmt: ToolFormat, metadata: Callable[[DecodeStats], dict[str, Any]]) -> None:
        self._format = fmt
        self._metadata = metadata

    def chunks(self, pieces: Iterator[Piece]) -> Iterator[ChatGenerationChunk]:
        """The chunks of one reply."""
        text, shown = "", 0
        for piece in pieces:
            if isinstance(piece, str):
                text += piece
                end = self._format.content_end(text)
                if end > shown:
                    yield ChatGenerationChunk(message=AIMessageChunk(content=text[shown:end]))
                    shown = end
                continue
            yield self._last(text[shown:], piece)

    def _last(self, rest: str, stats: DecodeStats) -> ChatGenerationChunk:
        reply = self._format.parse(rest)
        metadata = self._metadata(stats)
        if reply.invalid:
            metadata["tool_call_errors"] = [call.error for call in reply.invalid]
        message = AIMessageChunk(
            content=reply.content if reply.calls or reply.invalid else rest,
            tool_call_chunks=_call_chunks(reply),
            usage_metadata=usage(stats),  # type: ignore[arg-type]
            response_metadata=metadata,
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message, generation_info=metadata)


def _call_chunks(reply: ParsedReply) -> list[ToolCallChunk]:
    chunks = [
        tool_call_chunk(name=call.name, args=json.dumps(dict(call.arguments)), id=call.id, index=i)
        for i, call in enumerate(reply.calls)
    ]
    start = len(chunks)
    for i, bad in enumerate(reply.invalid, start):
        chunks.append(tool_call_chunk(name=bad.name, args=_unparseable(bad.text), id=bad.id, index=i))
    return chunks


def _unparseable(text: str) -> str:
    # LangChain reads a chunk's args leniently (a cut-off object parses): keep a broken call
    # broken, so that it lands in `invalid_tool_calls` rather than as a call with guessed args.
    try:
        parsed = parse_partial_json(text)
    except (ValueError, TypeError):
        return text
    return text if not isinstance(parsed, dict) else f"(invalid tool call) {text}"


def structured_output(model: Any, schema: Any, method: str, include_raw: bool) -> Runnable[Any, Any]:
    """``model.with_structured_output(schema, method=..., include_raw=...)``."""
    if method not in ("json_schema", "function_calling", "json_mode"):
        raise ValueError(f"method is 'json_schema', 'function_calling' or 'json_mode', got {method!r}")
    if schema is None and method != "json_mode":
        raise ValueError(f"method={method!r} needs a schema (only json_mode takes none)")
    pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    traced = {"kwargs": {"method": method}, "schema": schema} if schema is not None else None
    parser: Runnable[Any, Any]
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name, ls_structured_output_format=traced)
        parser = RunnableLambda(_forced_call(name)) | (
            PydanticToolsParser(tools=[schema], first_tool_only=True)
            if pydantic
            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        )
    else:
        response_format: dict[str, Any] = {"type": "json_object"}
        # JSON mode with a schema holds the reply to it as well: a small model does not follow
        # a schema it is only told about, and the parser would refuse what it wrote.
        if schema is not None:
            response_format = {
                "type": "json_schema",
                "json_schema": {"schema": convert_to_json_schema(schema)},
            }
        llm = model.bind(response_format=response_format, ls_structured_output_format=traced)
        parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")


def _forced_call(name: str) -> Callable[[BaseMessage], BaseMessage]:
    """A check that a forced call's reply holds a whole call to ``name``.

    LangChain's tool parsers read a reply without one as no answer (``None``); LangChain's own
    chat models raise `OutputParserException` for a call cut by ``max_tokens`` (in
    ``parsing_error`` with ``include_raw=True``), and so does this.
    """

    def check(message: BaseMessage) -> BaseMessage:
        if isinstance(message, AIMessage) and any(call["name"] == name for call in message.tool_calls):
            return message
        metadata = message.response_metadata
        cut = " (cut by max_tokens: raise it)" if metadata.get("finish_reason") == "length" else ""
        errors = metadata.get("tool_call_errors")
        reason = f": {'; '.join(errors)}" if errors else ""
        raise OutputParserException(
            f"the reply holds no complete call to {name!r}{cut}{reason}", llm_output=message.text
        )

    return check
