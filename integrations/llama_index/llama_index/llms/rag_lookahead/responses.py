"""LlamaIndex responses out of the engine's `TextStream`, and the stats they carry."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from contextlib import aclosing
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)

from rag_lookahead import DecodeStats, TextStream
from rag_lookahead.streaming import aiterate

__all__ = [
    "alast",
    "aresponses",
    "chat_response",
    "completion_response",
    "responses",
    "usage",
]

R = TypeVar("R", CompletionResponse, ChatResponse)
# Builds a response from the text so far, the new delta and the additional kwargs.
MakeResponse = Callable[[str, str | None, dict[str, Any]], R]


def usage(stats: DecodeStats) -> dict[str, Any]:
    """A response's ``additional_kwargs``: token counts (as LlamaIndex's token counter reads
    them) and, under ``"lookahead"``, the `DecodeStats` fields plus tokens/s, tokens per step
    and the acceptance rate."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
        "lookahead": stats.as_dict(),
    }


_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _raw(extra: dict[str, Any]) -> dict[str, Any] | None:
    """``{"usage": counts}``, where `TokenCountingHandler` looks first (it estimates otherwise)."""
    return {"usage": {k: extra[k] for k in _COUNTS}} if "prompt_tokens" in extra else None


def completion_response(text: str, delta: str | None, extra: dict[str, Any]) -> CompletionResponse:
    return CompletionResponse(text=text, delta=delta, raw=_raw(extra), additional_kwargs=extra)


def chat_response(text: str, delta: str | None, extra: dict[str, Any]) -> ChatResponse:
    message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
    return ChatResponse(message=message, delta=delta, raw=_raw(extra), additional_kwargs=extra)


def responses(stream: TextStream, make: MakeResponse[R]) -> Generator[R, None, None]:
    """Cumulative responses per decoded chunk, then one with an empty delta and the stats."""
    with stream:  # leaving early ends generation and releases the call's trie branches
        for chunk in stream.chunks():
            if chunk.text:
                yield make(stream.text, chunk.text, {})
    yield make(stream.text, "", usage(stream.stats))


async def aresponses(stream: TextStream, make: MakeResponse[R]) -> AsyncGenerator[R, None]:
    # `async for` alone would leave the chunks open when the consumer stops early.
    async with aclosing(aiterate(stream.chunks())) as chunks:
        async for chunk in chunks:
            if chunk.text:
                yield make(stream.text, chunk.text, {})
    yield make(stream.text, "", usage(stream.stats))


async def alast(responses: AsyncIterator[R]) -> R:
    """The last response (the whole text and the stats), as a blocking call returns it."""
    last = None
    async for response in responses:
        last = response
    assert last is not None  # `aresponses` always ends with the stats response
    last.delta = None
    return last
