"""`LookaheadLLM`: a LlamaIndex `CustomLLM` over a rag-lookahead engine (a local
`LookaheadEngine`, or a `ServerEngine` driving a vLLM, SGLang or OpenAI-compatible server).

Every call goes through ``engine.stream``: blocking calls drain the stream, async calls step it
in a worker thread. Completion prompts and chat messages both become chat messages that the
engine formats with the model's chat template (``rag_lookahead.prompts.encode_prompt``), so
``complete``, ``stream_complete``, ``chat`` and ``stream_chat`` share one formatting path and
cannot drift apart (the streaming/blocking drift of ``llama-index-llms-huggingface``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import AsyncGenerator, Generator, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr, field_validator
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.program.utils import FlexibleModel
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools.types import BaseTool
from llama_index.core.types import PydanticProgramMode

from llama_index.llms.rag_lookahead.responses import (
    alast,
    aresponses,
    chat_response,
    completion_response,
    responses,
    usage,
)
from llama_index.llms.rag_lookahead.retrievals import RetrievalScopes
from llama_index.llms.rag_lookahead.scoping import active_scope, scope_key
from llama_index.llms.rag_lookahead.tools import (
    ToolPlan,
    atool_responses,
    message_dict,
    parse_structured,
    partial_structured,
    schema_grammar,
    tool_plan,
    tool_response,
    tool_responses,
    tool_selections,
)
from rag_lookahead import (
    DEFAULT_MODEL,
    Completion,
    GenerationParams,
    LookaheadConfig,
    LookaheadEngine,
    TextStream,
)
from rag_lookahead.interface import Engine
from rag_lookahead.models import builtin_name
from rag_lookahead.streaming import aiterate
from rag_lookahead.structured import ToolsNotSupportedError

__all__ = ["LookaheadLLM"]

Model = TypeVar("Model", bound=BaseModel)
dispatcher = get_dispatcher(__name__)

_GENERATION_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationParams))
# What a call takes as keyword arguments; `documents` and `scope` are read by `_open`.
_CALL_OPTIONS = _GENERATION_FIELDS | {"stop", "max_tokens", "documents", "scope"}
# Roles some chat templates do not know, mapped to the ones every template has.
_ROLE_ALIASES = {
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.DEVELOPER: "system",
}
# What a chat call takes for tools (see `tool_plan`); `chat_with_tools` passes them.
_TOOL_OPTIONS = frozenset({"tools", "tool_choice", "tool_required", "allow_parallel_tool_calls"})
# A tool to ask the chat template whether it takes tools at all.
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}},
}
_PLAIN_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


class LookaheadLLM(CustomLLM, FunctionCallingLLM):
    """A local Hugging Face model decoded with rag-lookahead: the text of plain greedy decoding,
    sooner, drafting from the documents of the query being answered.

    ``LookaheadLLM()`` loads the embedded SmolLM2-135M-Instruct offline; pass ``engine=`` to
    share a loaded `LookaheadEngine` (several LLMs over one engine share its model, trie and
    lock, and calls from several threads are safe), or a `rag_lookahead.server.ServerEngine`
    to answer on a vLLM or SGLang server. Per call, ``stop=`` (a string or a list; it replaces
    the LLM's ``stop``), ``temperature=``, ``max_new_tokens=`` (or ``max_tokens=``), any other
    `GenerationParams` field, ``documents=`` (texts to draft from) and ``scope=`` (a
    `DocumentScope`) are accepted as keyword arguments; any other is a `TypeError`. Inside a
    `LookaheadQueryEngine` query the query's scope is used without being passed. Responses carry
    the exact token counts in ``raw["usage"]`` (where LlamaIndex's `TokenCountingHandler` reads
    them) and, with the decoding stats, in ``additional_kwargs`` (see `usage`); a stream's last
    response, with an empty delta, carries them.

    Nodes retrieved earlier in the same run (a chat engine's turn, an agent's tool call) are
    drafted from too (`RetrievalScopes`). As a `FunctionCallingLLM` it takes tools through the
    model's chat template (``chat_with_tools``, forced calls under a grammar), and
    ``structured_predict`` decodes under the output class's JSON schema (see `tools`).
    """

    model_name: str = Field(
        default=DEFAULT_MODEL,
        description="The model: a local directory or cached hub id, loaded offline when no "
        "engine is given; the default is the embedded SmolLM2-135M-Instruct.",
    )
    context_window: int = Field(
        default=DEFAULT_CONTEXT_WINDOW,
        gt=0,
        description="Tokens the model attends to; capped at the model's own window.",
    )
    max_new_tokens: int = Field(
        default=256, gt=0, description="Most tokens generated per call (LlamaIndex's num_output)."
    )
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        description="0 decodes greedily (the tokens of plain greedy decoding); above 0 samples "
        "at this temperature. A call's `temperature=` replaces it.",
    )
    stop: list[str] = Field(
        default_factory=list,
        description="Stop sequences for every call; a call's `stop=` replaces them. The text "
        "ends just before the first one found.",
    )
    lookahead: bool = Field(
        default=True,
        description="Draft and verify (True) or decode plainly (False); the text is the same.",
    )
    generate_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Other `GenerationParams` fields for every call, e.g. repetition_penalty.",
    )
    is_chat_model: bool = Field(
        default=True,
        description="Whether LlamaIndex should call `chat`; defaults to whether the tokenizer "
        "has a chat template. Either way prompts go through that template when there is one.",
    )

    track_retrievals: bool = Field(
        default=True,
        description="Draft from the nodes retrieved earlier in the same run (a chat turn, an "
        "agent run...), seen through LlamaIndex's instrumentation (see `RetrievalScopes`).",
    )

    _engine: Engine = PrivateAttr()
    _retrievals: RetrievalScopes | None = PrivateAttr(default=None)
    _tools_supported: bool | None = PrivateAttr(default=None)

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        config: LookaheadConfig | None = None,
        device: str | None = None,
        dtype: Any = None,
        trust_remote_code: bool = False,
        model_kwargs: dict[str, Any] | None = None,
        tokenizer_kwargs: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Wrap ``engine``, or load ``model_name`` offline with ``config`` and the loading
        options of `LookaheadEngine.from_pretrained`: ``device``, ``dtype``,
        ``trust_remote_code``, ``model_kwargs`` (device_map, quantization_config,
        attn_implementation, revision...), ``tokenizer_kwargs`` and ``chat_template_kwargs``
        (e.g. ``{"enable_thinking": False}`` for Qwen3).

        Other keyword arguments set the fields above (and `CustomLLM`'s, e.g. ``system_prompt``).
        """
        load = {
            "config": config,
            "device": device,
            "dtype": dtype,
            "trust_remote_code": trust_remote_code or None,
            "model_kwargs": model_kwargs,
            "tokenizer_kwargs": tokenizer_kwargs,
            "chat_template_kwargs": chat_template_kwargs,
        }
        if engine is None:
            name = kwargs.get("model_name")
            path = None if name in (None, DEFAULT_MODEL) else name
            engine = LookaheadEngine.from_pretrained(path, **{k: v for k, v in load.items() if v is not None})
        elif given := sorted(k for k, v in load.items() if v is not None):
            raise ValueError(f"pass either an engine or options to load one ({', '.join(given)}), not both")
        kwargs.setdefault("model_name", _engine_name(engine))
        window = engine.context_window
        if window is not None:
            kwargs["context_window"] = min(kwargs.get("context_window", window), window)
        kwargs.setdefault("is_chat_model", _has_chat_template(engine))
        super().__init__(**kwargs)
        self._engine = engine
        if self.track_retrievals and engine.drafts_from_documents:
            self._retrievals = RetrievalScopes.attach()

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @classmethod
    def class_name(cls) -> str:
        return "LookaheadLLM"

    @property
    def engine(self) -> Engine:
        """The engine every call of this LLM decodes with."""
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.context_window,
            num_output=self.max_new_tokens,
            model_name=self.model_name,
            is_chat_model=self.is_chat_model,
            is_function_calling_model=self._supports_tools(),
        )

    # ------------------------------------------------------------------ LlamaIndex surface

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        completion = self._open(self._completion_prompt(prompt, formatted), kwargs).complete()
        return completion_response(completion.text, None, usage(completion.stats))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        # Opened before returning, not on first iteration: the query's scope is read now.
        stream = self._open(self._completion_prompt(prompt, formatted), kwargs)
        return responses(stream, completion_response)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        plan, kwargs = self._tool_plan(kwargs)
        completion = self._open(self._chat_prompt(messages), kwargs, plan).complete()
        if plan.format is not None:
            return tool_response(completion.text, plan, None, usage(completion.stats))
        return chat_response(completion.text, None, usage(completion.stats))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        plan, kwargs = self._tool_plan(kwargs)
        stream = self._open(self._chat_prompt(messages), kwargs, plan)
        if plan.format is not None:
            return tool_responses(stream, plan)
        return responses(stream, chat_response)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        stream = await self._aopen(self._completion_prompt(prompt, formatted), kwargs)
        return await alast(aresponses(stream, completion_response))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        stream = await self._aopen(self._completion_prompt(prompt, formatted), kwargs)
        return aresponses(stream, completion_response)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        plan, kwargs = self._tool_plan(kwargs)
        stream = await self._aopen(self._chat_prompt(messages), kwargs, plan)
        if plan.format is not None:
            return await alast(atool_responses(stream, plan))
        return await alast(aresponses(stream, chat_response))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        plan, kwargs = self._tool_plan(kwargs)
        stream = await self._aopen(self._chat_prompt(messages), kwargs, plan)
        if plan.format is not None:
            return atool_responses(stream, plan)
        return aresponses(stream, chat_response)

    # ------------------------------------------------------------------ tools (FunctionCallingLLM)

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The arguments of the `chat` call `chat_with_tools` makes: the messages, and the
        tools with ``tool_choice`` (a ``tool_choice=`` keyword: ``"auto"``, ``"required"``,
        ``"none"`` or a tool's name), ``tool_required`` and ``allow_parallel_tool_calls``,
        which `chat` turns into the chat template's tools and, for a forced call, a grammar."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role=MessageRole.USER, content=user_msg)
                if isinstance(user_msg, str)
                else user_msg
            )
        return {
            "messages": messages,
            "tools": list(tools),
            "tool_choice": kwargs.pop("tool_choice", None),
            "tool_required": tool_required,
            "allow_parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls of a `chat_with_tools` response (see `tool_selections`)."""
        return tool_selections(response, error_on_no_tool_call)

    def _tool_plan(self, kwargs: dict[str, Any]) -> tuple[ToolPlan, dict[str, Any]]:
        """Pop a chat call's tool options: the plan, and the other options."""
        rest = {k: v for k, v in kwargs.items() if k not in _TOOL_OPTIONS}
        if not any(k in kwargs for k in _TOOL_OPTIONS):
            return ToolPlan(), rest
        plan = tool_plan(
            self._engine,
            kwargs.get("tools"),
            kwargs.get("tool_choice"),
            bool(kwargs.get("tool_required", False)),
            bool(kwargs.get("allow_parallel_tool_calls", True)),
        )
        return plan, rest

    def _supports_tools(self) -> bool:
        """Whether the model's chat template takes tools in a format this package reads."""
        if self._tools_supported is None:
            try:
                tool_plan(self._engine, [_PROBE_TOOL])
                self._tools_supported = True
            except (ToolsNotSupportedError, NotImplementedError):
                self._tools_supported = False
        return self._tools_supported

    # ------------------------------------------------------------------ structured output

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
        stream = self._open(
            self._structured_prompt(prompt, prompt_args), self._structured_kwargs(output_cls, llm_kwargs)
        )
        result = parse_structured(output_cls, stream.complete())
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
        stream = await self._aopen(
            self._structured_prompt(prompt, prompt_args), self._structured_kwargs(output_cls, llm_kwargs)
        )
        await alast(aresponses(stream, chat_response))
        result = parse_structured(output_cls, Completion(stream.text, list(stream.token_ids), stream.stats))
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
        stream = self._open(
            self._structured_prompt(prompt, prompt_args), self._structured_kwargs(output_cls, llm_kwargs)
        )
        return _partials(stream, output_cls)

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
        stream = await self._aopen(
            self._structured_prompt(prompt, prompt_args), self._structured_kwargs(output_cls, llm_kwargs)
        )
        return _apartials(stream, output_cls)

    def _structured_prompt(self, prompt: PromptTemplate, prompt_args: dict[str, Any]) -> Any:
        return self._chat_prompt(prompt.format_messages(llm=self, **prompt_args))

    def _structured_kwargs(
        self, output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None
    ) -> dict[str, Any]:
        kwargs = dict(llm_kwargs or {})
        if "grammar" in kwargs:
            raise TypeError("structured output sets its own grammar (the output class's JSON schema)")
        return {**kwargs, "grammar": schema_grammar(output_cls)}

    # ------------------------------------------------------------------ the one path

    def _completion_prompt(self, prompt: str, formatted: bool) -> Any:
        """A completion prompt as chat messages (plain text without a chat template).

        ``formatted=True`` means LlamaIndex already applied ``completion_to_prompt`` and the
        system prompt (as `LLM.predict` does); otherwise they are applied here.
        """
        if not formatted:
            assert self.completion_to_prompt is not None  # `LLM`'s validator fills it in
            prompt = self.completion_to_prompt(prompt)
        system = None if formatted else self.system_prompt
        if not _has_chat_template(self._engine):
            return f"{system}\n\n{prompt}" if system else prompt
        messages = [{"role": "system", "content": system}] if system else []
        return [*messages, {"role": "user", "content": prompt}]

    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> Any:
        if not _has_chat_template(self._engine):
            assert self.messages_to_prompt is not None  # `LLM`'s validator fills it in
            return self.messages_to_prompt(messages)
        return [message_dict(m, _ROLE_ALIASES.get(m.role, m.role.value)) for m in messages]

    def _open(self, prompt: Any, kwargs: dict[str, Any], plan: ToolPlan | None = None) -> TextStream:
        """Start generating: nothing runs until the stream is iterated."""
        plan = plan or ToolPlan()
        kwargs = dict(kwargs)
        if plan.grammar is not None:
            if kwargs.get("grammar") is not None:
                raise TypeError("a forced tool call sets its own grammar; pass one or the other")
            kwargs["grammar"] = plan.grammar
        scope = kwargs.pop("scope", None)
        documents = kwargs.pop("documents", ())
        params = self._params(kwargs)
        engine = self._engine if self.lookahead else _plain_engine(self._engine)
        claim = None
        if scope is None and engine.drafts_from_documents:
            # A query's nodes reach the drafts only where the engine drafts from documents; a
            # vLLM server sees its prompt alone (and a refine prompt may show only some nodes).
            scope = active_scope(scope_key(self._engine))
            if scope is None and self._retrievals is not None:
                claim = self._retrievals.claim(self._engine)  # nodes retrieved earlier in this run
                scope = claim.scope if claim is not None else None
        try:
            stream = engine.stream(prompt, params, documents=documents, scope=scope, **plan.stream_kwargs())
        except BaseException:
            if claim is not None:
                claim.release()
            raise
        if claim is not None:
            weakref.finalize(stream, claim.release)  # the run's scope stays open while it is read
        return stream

    async def _aopen(self, prompt: Any, kwargs: dict[str, Any], plan: ToolPlan | None = None) -> TextStream:
        # Tokenizing a long prompt is work too; `to_thread` copies the context, scope included.
        return await asyncio.to_thread(self._open, prompt, kwargs, plan)

    def _params(self, kwargs: dict[str, Any]) -> GenerationParams:
        unknown = sorted(set(kwargs) - _CALL_OPTIONS)
        if unknown:
            raise TypeError(
                f"unexpected keyword argument(s) {unknown}; accepted: {', '.join(sorted(_CALL_OPTIONS))}"
            )
        fields = {**self.generate_kwargs, **{k: v for k, v in kwargs.items() if k in _GENERATION_FIELDS}}
        # A call's stops replace the LLM's, as any other setting given per call does.
        call_stop = [*_as_list(kwargs.get("stop")), *_as_list(kwargs.get("stop_strings"))]
        default_stop = [*_as_list(self.generate_kwargs.get("stop_strings")), *self.stop]
        fields["stop_strings"] = tuple(dict.fromkeys(call_stop if _has_stop(kwargs) else default_stop))
        max_new = kwargs.get("max_new_tokens") or kwargs.get("max_tokens")  # OpenAI-style callers
        fields["max_new_tokens"] = max_new or self.max_new_tokens
        fields.update(_sampling(fields.get("temperature", self.temperature), fields.get("do_sample")))
        return GenerationParams(**fields)


def _partials(stream: TextStream, output_cls: type[Model]) -> Generator[Any, None, None]:
    last = None
    with stream:
        for chunk in stream.chunks():
            partial = partial_structured(output_cls, stream.text) if chunk.text else None
            if partial is not None and partial != last:
                last = partial
                yield partial
    yield parse_structured(output_cls, Completion(stream.text, list(stream.token_ids), stream.stats))


async def _apartials(stream: TextStream, output_cls: type[Model]) -> AsyncGenerator[Any, None]:
    last = None
    async with aclosing(aiterate(stream.chunks())) as chunks:
        async for chunk in chunks:
            partial = partial_structured(output_cls, stream.text) if chunk.text else None
            if partial is not None and partial != last:
                last = partial
                yield partial
    yield parse_structured(output_cls, Completion(stream.text, list(stream.token_ids), stream.stats))


def _sampling(temperature: Any, do_sample: Any) -> dict[str, Any]:
    """LlamaIndex's temperature: 0 is greedy, above 0 samples (unless ``do_sample`` says else)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    sample = temperature > 0 if do_sample is None else do_sample
    if sample and temperature == 0:
        raise ValueError("sampling (do_sample=True) needs a temperature above 0")
    # Greedy decoding ignores the temperature; GenerationParams takes only positive ones.
    return {"do_sample": sample, "temperature": float(temperature) if temperature > 0 else 1.0}


def _has_stop(kwargs: dict[str, Any]) -> bool:
    return kwargs.get("stop") is not None or kwargs.get("stop_strings") is not None


def _plain_engine(engine: Engine) -> Engine:
    """An engine that never drafts, over ``engine``'s model, for ``lookahead=False``."""
    plain = _PLAIN_ENGINES.get(engine)
    if plain is None:
        plain = _PLAIN_ENGINES.setdefault(engine, engine.plain())  # shares the model, runner and trie
    return plain


def _has_chat_template(engine: Engine) -> bool:
    return engine.chat


def _engine_name(engine: Engine) -> str:
    name = engine.model_name
    # A built-in model loads from a converted cache directory named after it.
    return (builtin_name(name) or name) if name else DEFAULT_MODEL


def _as_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
