"""The structured-output surface of `LookaheadLLM`: LlamaIndex's four ``structured_predict``
methods, decoded under the output class's JSON schema (see `structured`)."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import AsyncGenerator, Generator
from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import BaseModel
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.llm import LLM
from llama_index.core.program.utils import FlexibleModel
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import PydanticProgramMode

from llama_index.llms.rag_lookahead import structured
from rag_lookahead import TextStream

__all__ = ["StructuredOutputLLM"]

Model = TypeVar("Model", bound=BaseModel)
dispatcher = get_dispatcher(__name__)


class StructuredOutputLLM(LLM):
    """An LLM whose structured output is a reply decoded under the output class's JSON
    schema (in `PydanticProgramMode.DEFAULT`; another mode goes LlamaIndex's way)."""

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
        schema = structured.response_format(output_cls)
        kwargs = structured.structured_options(llm_kwargs)
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
        result = structured.predict(
            self._structured_stream(output_cls, prompt, llm_kwargs, prompt_args), output_cls
        )
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
        result = await structured.apredict(stream, output_cls)
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
        return structured.partials(
            self._structured_stream(output_cls, prompt, llm_kwargs, prompt_args), output_cls
        )

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
        return structured.apartials(stream, output_cls)
