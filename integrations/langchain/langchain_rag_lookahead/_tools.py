"""Tool calls and structured output for `ChatLookahead`.

The core plans a call's tools (`rag_lookahead.protocol`: the chat template renders them, the
model's tool format parses the reply, a grammar forces a call); here LangChain's side:
``bind_tools`` arguments, the ``tool_call_chunks`` of a reply and ``with_structured_output``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from rag_lookahead.protocol import HeldReply, openai_logprobs
from rag_lookahead.streaming import TokenLogprob
from rag_lookahead.structured import ParsedReply, ToolFormat
from rag_lookahead.structured import tool_choice as normalised_choice

__all__ = ["bound_tools", "message_chunks", "openai_tools", "structured_output"]


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LangChain tools (functions, pydantic models, TypedDicts, tool dicts) as OpenAI-style dicts.

    The call's plan checks them (`rag_lookahead.structured.check_tools`).
    """
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools are a sequence of tools, got {type(tools).__name__}")
    return [convert_to_openai_tool(t) for t in tools]


def bound_tools(tools: Sequence[Any], tool_choice: object) -> dict[str, Any]:
    """``bind_tools``' arguments as call options: the tools converted, the choice normalised.

    A bad choice is an error when binding, not at the call.
    """
    converted = openai_tools(tools)
    names = [t["function"]["name"] for t in converted]
    return {"tools": converted, "tool_choice": normalised_choice(tool_choice, names)}


def message_chunks(
    pieces: Iterator[Piece], fmt: ToolFormat | None, metadata: Callable[[DecodeStats], dict[str, Any]]
) -> Iterator[ChatGenerationChunk]:
    """A reply's chunks: its content as it shows, then one last chunk with the rest.

    The content is held back from where a tool call may begin (see `HeldReply`); the last
    chunk carries what was held back, its calls, the usage and ``metadata`` (the stats come
    once, last: usage and metadata are counted exactly once when merged).
    """
    held = HeldReply(fmt)
    logprobs: list[TokenLogprob] = []  # those of text not shown yet
    for piece in pieces:
        if isinstance(piece, DecodeStats):
            yield _last(held.end(), piece, metadata(piece), logprobs)
            continue
        logprobs += piece.logprobs or ()
        if shown := held.add(piece.text):
            info, logprobs = _logprobs_info(logprobs), []
            yield ChatGenerationChunk(message=AIMessageChunk(content=shown), generation_info=info)


def _logprobs_info(logprobs: list[TokenLogprob]) -> dict[str, Any] | None:
    """A chunk's ``generation_info`` for its tokens' log probabilities, as ChatOpenAI's.

    LangChain merges it into ``response_metadata``, and the ``content`` lists of merged chunks
    add up.
    """
    return {"logprobs": openai_logprobs("chat", logprobs)} if logprobs else None


def _last(
    rest: ParsedReply, stats: DecodeStats, metadata: dict[str, Any], logprobs: list[TokenLogprob]
) -> ChatGenerationChunk:
    if rest.invalid:
        metadata["tool_call_errors"] = [call.error for call in rest.invalid]
    message = AIMessageChunk(
        content=rest.content,
        tool_call_chunks=_call_chunks(rest),
        usage_metadata=usage(stats),  # type: ignore[arg-type]
        response_metadata=metadata,
        chunk_position="last",
    )
    # Not in the message's own metadata: LangChain lays that over the merged generation_info,
    # which holds every chunk's log probabilities.
    return ChatGenerationChunk(
        message=message, generation_info={**metadata, **(_logprobs_info(logprobs) or {})}
    )


def _call_chunks(reply: ParsedReply) -> list[ToolCallChunk]:
    """A reply's calls as LangChain's chunks; a call that does not parse stays invalid."""
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
