"""Structured output for `LookaheadLLM`: replies decoded under a pydantic model's JSON schema.

`StructuredOutputLLM` is LlamaIndex's ``structured_predict`` surface over it. The schema
reaches the core as a request's ``response_format`` (the grammar the HTTP server builds for
the same request); here the parsing of the reply into the model, and the partial objects a
streamed reply already holds.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import AsyncGenerator, Generator, Mapping
from contextlib import aclosing
from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import BaseModel, PrivateAttr, ValidationError
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.llm import LLM
from llama_index.core.llms.utils import parse_partial_json
from llama_index.core.program.utils import FlexibleModel, create_flexible_model
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import PydanticProgramMode

from rag_lookahead import TextStream
from rag_lookahead.protocol import within_deadline
from rag_lookahead.streaming import DecodeStats, aiterate

__all__ = [
    "StructuredOutputError",
    "StructuredOutputLLM",
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
dispatcher = get_dispatcher(__name__)


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


def predict(stream: TextStream, output_cls: type[Model], deadline: float | None = None) -> Model:
    """The whole reply as an ``output_cls`` instance (`TimeoutError` past ``deadline`` seconds)."""
    for _ in within_deadline(stream.chunks(), stream, deadline):
        pass
    return parse_structured(output_cls, stream.text, stream.stats)


async def apredict(stream: TextStream, output_cls: type[Model], deadline: float | None = None) -> Model:
    """`predict` for async callers (decoding runs in worker threads)."""
    async with aclosing(aiterate(within_deadline(stream.chunks(), stream, deadline))) as chunks:
        async for _ in chunks:
            pass
    return parse_structured(output_cls, stream.text, stream.stats)


def partials(
    stream: TextStream, output_cls: type[Model], deadline: float | None = None
) -> Generator[Any, None, None]:
    """Partial objects as the JSON grows (each new one once), then the ``output_cls`` instance."""
    last = None
    with stream:
        for chunk in within_deadline(stream.chunks(), stream, deadline):
            partial = partial_structured(output_cls, stream.text) if chunk.text else None
            if partial is not None and partial != last:
                last = partial
                yield partial
    yield parse_structured(output_cls, stream.text, stream.stats)


def apartials(
    stream: TextStream, output_cls: type[Model], deadline: float | None = None
) -> AsyncGenerator[Any, None]:
    """`partials` for async callers (decoding and parsing run in a worker thread)."""
    return aiterate(partials(stream, output_cls, deadline))


class StructuredOutputLLM(LLM):
    """An LLM whose structured output is a reply decoded under the output class's JSON
    schema (in `PydanticProgramMode.DEFAULT`; another mode goes LlamaIndex's way)."""

    # Seconds a whole call may take (a local call's ``timeout``), or ``None``.
    _deadline: float | None = PrivateAttr(default=None)

    @abstractmethod
    def _open_structured(
        self, messages: list[ChatMessage], kwargs: dict[str, Any], schema: Any
    ) -> TextStream:
        """The started stream of the reply to ``messages``, held to ``schema`` (a request's
        ``response_format``)."""

    def _structured_stream(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None,
        prompt_args: dict[str, Any],
    ) -> TextStream:
        schema = response_format(output_cls)
        kwargs = structured_options(llm_kwargs)
        return self._open_structured(prompt.format_messages(llm=self, **prompt_args), kwargs, schema)

    def structured_predict(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """An ``output_cls`` instance, decoded under the grammar of its JSON schema.

        The reply is JSON that validates against the schema token by token (the output of
        plain decoding under that grammar, sooner); one cut by ``max_new_tokens`` raises
        `StructuredOutputError`. Another `pydantic_program_mode` goes LlamaIndex's way.
        """
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args)
        )
        stream = self._structured_stream(output_cls, prompt, llm_kwargs, prompt_args)
        result = predict(stream, output_cls, self._deadline)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    async def astructured_predict(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """`structured_predict`, decoding in worker threads."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args)
        )
        stream = await asyncio.to_thread(self._structured_stream, output_cls, prompt, llm_kwargs, prompt_args)
        result = await apredict(stream, output_cls, self._deadline)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    def stream_structured_predict(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Model | FlexibleModel, None, None]:
        """Partial objects (every field optional) as the JSON grows, then the ``output_cls``
        instance; decoded under the schema's grammar."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().stream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        stream = self._structured_stream(output_cls, prompt, llm_kwargs, prompt_args)
        return partials(stream, output_cls, self._deadline)

    async def astream_structured_predict(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Model | FlexibleModel, None]:
        """`stream_structured_predict`, decoding in worker threads."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        stream = await asyncio.to_thread(self._structured_stream, output_cls, prompt, llm_kwargs, prompt_args)
        return apartials(stream, output_cls, self._deadline)
