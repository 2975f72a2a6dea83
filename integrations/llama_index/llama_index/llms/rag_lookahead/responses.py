"""LlamaIndex responses out of the engine's `TextStream`, and the stats they carry.

A reply streams through the core's `HeldReply`, as the HTTP server's does: every piece that is
surely content is a response's delta; a chat reply that may call tools is held back from
where a call may begin, and its last response carries the parsed calls (see `tools`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LogProb,
    MessageRole,
)

from rag_lookahead import DecodeStats, TextStream, TokenLogprob, protocol
from rag_lookahead.protocol import HeldReply, within_deadline
from rag_lookahead.streaming import aiterate
from rag_lookahead.structured import ToolFormat

__all__ = [
    "Shape",
    "alast",
    "aresponses",
    "chat_response",
    "completion_response",
    "last",
    "logprobs",
    "responses",
    "usage",
]

R = TypeVar("R", CompletionResponse, ChatResponse)
# Builds a response from the text so far, the new delta and the additional kwargs.
MakeResponse = Callable[[str, str | None, dict[str, Any]], R]
# Builds the last response from the whole text, the part of it already streamed and the usage.
MakeLast = Callable[[str, str, dict[str, Any]], R]


def usage(stats: DecodeStats) -> dict[str, Any]:
    """A response's ``additional_kwargs``: token counts (as LlamaIndex's token counter reads
    them), the prompt tokens whose KV entries were reused from an earlier prompt (OpenAI's
    ``prompt_tokens_details.cached_tokens``) and, under ``"lookahead"``, the `DecodeStats`
    fields plus tokens/s, tokens per step and the acceptance rate."""
    return {**protocol.usage(stats), "lookahead": stats.as_dict()}


_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details")


def _raw(extra: dict[str, Any]) -> dict[str, Any] | None:
    """``{"usage": counts}``, where `TokenCountingHandler` looks first (it estimates otherwise)."""
    return {"usage": {k: extra[k] for k in _COUNTS}} if "prompt_tokens" in extra else None


def completion_response(text: str, delta: str | None, extra: dict[str, Any]) -> CompletionResponse:
    return CompletionResponse(text=text, delta=delta, raw=_raw(extra), additional_kwargs=extra)


def chat_response(text: str, delta: str | None, extra: dict[str, Any]) -> ChatResponse:
    message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
    return ChatResponse(message=message, delta=delta, raw=_raw(extra), additional_kwargs=extra)


@dataclass(frozen=True)
class Shape(Generic[R]):
    """How a reply becomes responses: one per shown piece, and the last with the stats.

    Attributes:
        make: A streamed piece's response.
        tool_format: The model's tool format when the reply is parsed for calls.
        make_last: The last response (default: ``make`` of the whole text, an empty delta).
    """

    make: MakeResponse[R]
    tool_format: ToolFormat | None = None
    make_last: MakeLast[R] | None = None

    def piece(self, reply: HeldReply, text: str) -> R | None:
        delta = reply.add(text) if text else ""
        return self.make(reply.shown_text, delta, {}) if delta else None

    def end(self, stream: TextStream, reply: HeldReply) -> R:
        shown = reply.shown_text
        if self.make_last is not None:
            return self.make_last(stream.text, shown, usage(stream.stats))
        return self.make(stream.text, "", usage(stream.stats))


def logprobs(items: list[TokenLogprob]) -> list[list[LogProb]]:
    """One list per token, as LlamaIndex's OpenAI LLM reads OpenAI's: the ``top_logprobs``
    most likely tokens at its position, most likely first; with ``top_logprobs=0``, the token
    itself (where that LLM would drop the position)."""
    return [
        [LogProb(token=t.token, logprob=t.logprob, bytes=t.bytes) for t in (item.top_logprobs or (item,))]
        for item in items
    ]


def _with_logprobs(response: R, stream: TextStream) -> R:
    """``response`` with the log probabilities of every token so far, when the call asked (a
    response is cumulative: its text is the whole text so far, its delta the new part)."""
    if stream.logprobs is not None:
        response.logprobs = logprobs(stream.logprobs)
    return response


def responses(stream: TextStream, shape: Shape[R], deadline: float | None = None) -> Generator[R, None, None]:
    """Cumulative responses per shown piece, then one with the rest and the stats; past
    ``deadline`` seconds, `TimeoutError` (see `within_deadline`)."""
    reply = HeldReply(shape.tool_format)
    with stream:  # leaving early ends generation and releases the call's trie branches
        for chunk in within_deadline(stream.chunks(), stream, deadline):
            if (response := shape.piece(reply, chunk.text)) is not None:
                yield _with_logprobs(response, stream)
    yield _with_logprobs(shape.end(stream, reply), stream)


def aresponses(stream: TextStream, shape: Shape[R], deadline: float | None = None) -> AsyncGenerator[R, None]:
    """`responses` for async callers (decoding, and building the responses, run in a worker
    thread)."""
    return aiterate(responses(stream, shape, deadline))


def last(responses: Iterable[R]) -> R:
    """The last response (the whole text and the stats), as a blocking call returns it."""
    final = None
    for response in responses:
        final = response
    assert final is not None  # `responses` always ends with the stats response
    final.delta = None
    return final


async def alast(responses: AsyncIterator[R]) -> R:
    """`last` of async responses."""
    final = None
    async for response in responses:
        final = response
    assert final is not None
    final.delta = None
    return final
