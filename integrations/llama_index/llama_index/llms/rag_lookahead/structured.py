"""Structured output for `LookaheadLLM`: replies decoded under a pydantic model's JSON schema.

The schema reaches the core as a request's ``response_format`` (the grammar the HTTP server
builds for the same request); here the parsing of the reply into the model, and the partial
objects a streamed reply already holds.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Mapping
from contextlib import aclosing
from typing import Any, TypeVar

from llama_index.core.bridge.pydantic import BaseModel, ValidationError
from llama_index.core.llms.utils import parse_partial_json
from llama_index.core.program.utils import FlexibleModel, create_flexible_model

from rag_lookahead import TextStream
from rag_lookahead.streaming import DecodeStats, aiterate

__all__ = [
    "StructuredOutputError",
    "apartials",
    "apredict",
    "parse_structured",
    "partial_structured",
    "partials",
    "predict",
    "response_format",
    "structured_options",
]

Model = TypeVar("Model", bound=BaseModel)


class StructuredOutputError(ValueError):
    """A structured reply that does not parse against its schema (cut by ``max_new_tokens``)."""


def response_format(output_cls: type[BaseModel]) -> dict[str, Any]:
    """The ``response_format`` of a JSON reply that validates against ``output_cls``'s schema."""
    if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
        raise TypeError(f"output_cls is a pydantic model class, got {output_cls!r}")
    schema = output_cls.model_json_schema()
    return {"type": "json_schema", "json_schema": {"name": output_cls.__name__, "schema": schema}}


def structured_options(llm_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A structured call's keyword arguments: any but a grammar of its own."""
    kwargs = dict(llm_kwargs or {})
    if "grammar" in kwargs:
        raise TypeError("structured output sets its own grammar (the output class's JSON schema)")
    return kwargs


def parse_structured(output_cls: type[Model], text: str, stats: DecodeStats) -> Model:
    """``text`` as an ``output_cls`` instance, or `StructuredOutputError` saying why."""
    try:
        return output_cls.model_validate_json(text)
    except ValidationError as err:
        cut = stats.finish_reason == "length"
        hint = " (cut by max_new_tokens: raise it)" if cut else ""
        raise StructuredOutputError(
            f"the reply is not a valid {output_cls.__name__}{hint}: {text!r}; {err}"
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


def predict(stream: TextStream, output_cls: type[Model]) -> Model:
    """The whole reply as an ``output_cls`` instance."""
    completion = stream.complete()
    return parse_structured(output_cls, completion.text, completion.stats)


async def apredict(stream: TextStream, output_cls: type[Model]) -> Model:
    """`predict` for async callers (decoding runs in worker threads)."""
    async with aclosing(aiterate(stream.chunks())) as chunks:
        async for _ in chunks:
            pass
    return parse_structured(output_cls, stream.text, stream.stats)


def partials(stream: TextStream, output_cls: type[Model]) -> Generator[Any, None, None]:
    """Partial objects as the JSON grows (each new one once), then the ``output_cls`` instance."""
    last = None
    with stream:
        for chunk in stream.chunks():
            partial = partial_structured(output_cls, stream.text) if chunk.text else None
            if partial is not None and partial != last:
                last = partial
                yield partial
    yield parse_structured(output_cls, stream.text, stream.stats)


async def apartials(stream: TextStream, output_cls: type[Model]) -> AsyncGenerator[Any, None]:
    """`partials` for async callers (decoding runs in worker threads)."""
    last = None
    async with aclosing(aiterate(stream.chunks())) as chunks:
        async for chunk in chunks:
            partial = partial_structured(output_cls, stream.text) if chunk.text else None
            if partial is not None and partial != last:
                last = partial
                yield partial
    yield parse_structured(output_cls, stream.text, stream.stats)
