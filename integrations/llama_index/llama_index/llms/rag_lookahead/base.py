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
import functools
import warnings
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

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
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from llama_index.llms.rag_lookahead import calls
from llama_index.llms.rag_lookahead.calls import Call, Settings
from llama_index.llms.rag_lookahead.function_calling import ToolCallingLLM
from llama_index.llms.rag_lookahead.responses import (
    R,
    Shape,
    alast,
    aresponses,
    chat_response,
    completion_response,
    last,
    responses,
)
from llama_index.llms.rag_lookahead.retrievals import RetrievalScopes
from llama_index.llms.rag_lookahead.scoping import open_stream
from llama_index.llms.rag_lookahead.structured import StructuredOutputLLM
from llama_index.llms.rag_lookahead.tools import last_tool_response, message_dict
from rag_lookahead import DEFAULT_MODEL, LookaheadConfig, TextStream
from rag_lookahead.frontends import EngineSource, display_name, plain_engine
from rag_lookahead.interface import Engine
from rag_lookahead.loading import LoadKeywords, LoadOptions
from rag_lookahead.remote import ServerKind

__all__ = ["LookaheadLLM"]

# Roles some chat templates do not know, mapped to the ones every template has.
_ROLE_ALIASES = {
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.DEVELOPER: "system",
}
_COMPLETION: Shape[CompletionResponse] = Shape(completion_response)


class LookaheadLLM(StructuredOutputLLM, CustomLLM, ToolCallingLLM):
    """A local Hugging Face model decoded with rag-lookahead: the text of plain greedy decoding,
    sooner, drafting from the documents of the query being answered.

    ``LookaheadLLM()`` loads the embedded SmolLM2-135M-Instruct offline; pass ``engine=`` to
    share a loaded `LookaheadEngine` (several LLMs over one engine share its model, trie and
    lock, and calls from several threads are safe), or a `rag_lookahead.remote.ServerEngine`
    to answer on a vLLM or SGLang server. Per call, ``stop=`` (a string or a list; it replaces
    the LLM's ``stop``), ``temperature=``, ``max_new_tokens=`` (or ``max_tokens=``), any other
    `GenerationParams` field, ``documents=`` (texts to draft from), ``prediction=`` (text the
    answer is expected to copy, drafted from first) and ``scope=`` (a `DocumentScope`) are
    accepted as keyword arguments; any other is a `TypeError`. Inside a
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
        le=2.0,
        description="0 decodes greedily (the tokens of plain greedy decoding); above 0 samples "
        "at this temperature (at most 2, as every front end takes). A call's `temperature=` "
        "replaces it.",
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
    logprobs: bool | None = Field(
        default=None,
        description="Report each new token's log probability (the model's raw distribution) in "
        "a response's `logprobs`, as LlamaIndex's OpenAI LLM does; a call's `logprobs=` replaces it.",
    )
    top_logprobs: int | None = Field(
        default=None, ge=0, le=20, description="With `logprobs`: the most likely tokens per position."
    )
    prediction: str | None = Field(
        default=None,
        description="Text every answer is expected to copy (OpenAI's Predicted Outputs: the file "
        "being edited), drafted from first; the answer is the same. A call's `prediction=` (a "
        "string or OpenAI's {'type': 'content', 'content': ...}) replaces it.",
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

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        lookahead_config: LookaheadConfig | None = None,
        model: str | None = None,
        base_url: str | None = None,
        server_kind: ServerKind = "openai",
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        config: LookaheadConfig | None = None,
        **kwargs: Any,
    ) -> None:
        """Wrap ``engine``, or load ``model_name`` offline with the loading options of
        `rag_lookahead.LoadOptions` given by name: ``device``, ``dtype``,
        ``trust_remote_code``, ``model_kwargs`` (device_map, quantization_config,
        attn_implementation, revision...), ``tokenizer_kwargs``, ``chat_template_kwargs``
        (e.g. ``{"enable_thinking": False}`` for Qwen3) and ``progress`` (default ``True``:
        progress bars on standard error, when it is a terminal, while the model is converted
        and its costs measured; see `EngineSource`).
        ``lookahead_config`` is the drafting settings (`LookaheadConfig`): the loaded
        model's, or those of a variant of the given `LookaheadEngine` (differing from its own
        in per-call settings only, `check_variant`); ``config`` is its old
        name (deprecated), a loading option refused beside an engine.

        Or, with ``base_url`` (an OpenAI-compatible API root such as
        ``"http://localhost:8000/v1"``), answer on that server as LangChain's ``ChatLookahead``
        does: ``model`` is then the served model's name, and ``server_kind`` ('vllm', 'sglang',
        'rag-lookahead' or 'openai'), ``api_key``, ``timeout`` (seconds to wait for the server,
        default 600) and ``max_retries`` (default 2) go to its `ServerEngine`. ``model`` is
        ``model_name`` under LangChain's and OpenAI's name. Without ``base_url``, ``timeout``
        is the seconds a whole call may take: past them the call stops and raises
        `TimeoutError`.

        Other keyword arguments set the fields above (and `CustomLLM`'s, e.g. ``system_prompt``).
        """
        if model is not None and kwargs.setdefault("model_name", model) != model:
            raise ValueError("pass either `model` or `model_name`, not both")
        progress = kwargs.pop("progress", True)
        loading = {name: kwargs.pop(name) for name in LoadKeywords.__annotations__ if name in kwargs}
        source = EngineSource(
            engine=engine,
            load=LoadOptions.of(None, None if engine is not None else kwargs.get("model_name"), **loading),
            base_url=base_url,
            server={
                "kind": None if server_kind == "openai" else server_kind,
                "api_key": api_key,
                "max_retries": max_retries,
                "context_window": kwargs.get("context_window") if base_url is not None else None,
            },
            timeout=timeout,
            lookahead_config=_renamed_config(config, lookahead_config, engine),
            progress=progress,
        )
        engine = source.resolve()
        kwargs.setdefault("model_name", display_name(engine))
        window = engine.context_window
        if window is not None:
            kwargs["context_window"] = min(kwargs.get("context_window", window), window)
        kwargs.setdefault("is_chat_model", engine.chat)
        super().__init__(**kwargs)
        self._engine = engine
        self._deadline = source.deadline
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
        return last(responses(*self._completion(prompt, formatted, kwargs), self._deadline))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return responses(*self._completion(prompt, formatted, kwargs), self._deadline)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return last(responses(*self._chat(messages, kwargs), self._deadline))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return responses(*self._chat(messages, kwargs), self._deadline)

    # Async calls open in a worker thread (tokenizing a long prompt is work too; `to_thread`
    # copies the context, the published scope included) and decode in worker threads.

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await alast(await self._aopen(self._completion, prompt, formatted, kwargs))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return await self._aopen(self._completion, prompt, formatted, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await alast(await self._aopen(self._chat, messages, kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return await self._aopen(self._chat, messages, kwargs)

    async def _aopen(
        self, open_call: Callable[..., tuple[TextStream, Shape[R]]], *args: Any
    ) -> AsyncGenerator[R, None]:
        """The responses of a call opened in a worker thread (tokenizing a long prompt is work too)."""
        return aresponses(*await asyncio.to_thread(open_call, *args), self._deadline)

    # Every surface method streams. The call is opened before its responses are returned, not
    # on their first iteration, so that the scope published at the call is the one read.

    def _completion(
        self, prompt: str, formatted: bool, kwargs: dict[str, Any]
    ) -> tuple[TextStream, Shape[CompletionResponse]]:
        stream, _ = self._open(self._completion_prompt(prompt, formatted), kwargs)
        return stream, _COMPLETION

    def _chat(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> tuple[TextStream, Shape[ChatResponse]]:
        stream, call = self._open(self._chat_prompt(messages), kwargs, chat=True)
        return stream, _chat_shape(call)

    # ------------------------------------------------------------------ structured output

    def _open_structured(
        self, messages: list[ChatMessage], kwargs: dict[str, Any], schema: Any
    ) -> TextStream:
        stream, _ = self._open(self._chat_prompt(messages), kwargs, False, schema)
        return stream

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
        if not self._engine.chat:
            return f"{system}\n\n{prompt}" if system else prompt
        messages = [{"role": "system", "content": system}] if system else []
        return [*messages, {"role": "user", "content": prompt}]

    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> Any:
        if not self._engine.chat:
            assert self.messages_to_prompt is not None  # `LLM`'s validator fills it in
            return self.messages_to_prompt(messages)
        return [message_dict(m, _ROLE_ALIASES.get(m.role, m.role.value)) for m in messages]

    def _open(
        self, prompt: Any, kwargs: dict[str, Any], chat: bool = False, response_format: Any = None
    ) -> tuple[TextStream, Call]:
        """Plan the call and start it: nothing runs until the stream is iterated."""
        asked = {"logprobs": self.logprobs, "top_logprobs": self.top_logprobs}
        generate = {**{k: v for k, v in asked.items() if v is not None}, **self.generate_kwargs}
        settings = Settings(
            self.max_new_tokens, self.temperature, tuple(self.stop), generate, self.prediction
        )
        call = calls.plan(prompt, kwargs, self._engine, settings, chat=chat, response_format=response_format)
        engine = self._engine if self.lookahead else plain_engine(self._engine)
        return open_stream(self._engine, engine, call.plan, call.scope, self._retrievals), call


def _renamed_config(
    config: LookaheadConfig | None, lookahead_config: LookaheadConfig | None, engine: Engine | None
) -> LookaheadConfig | None:
    """``lookahead_config``, or ``config`` under its old name: a loading option, as it was."""
    if config is None:
        return lookahead_config
    warnings.warn("LookaheadLLM(config=...) is now lookahead_config=", DeprecationWarning, stacklevel=3)
    if engine is not None or lookahead_config is not None:
        raise ValueError(
            "takes either an engine or options to load one, not both: pass either `engine` or config "
            "(or lookahead_config=, the drafting settings of a given engine's variant)"
        )
    return config


def _chat_shape(call: Call) -> Shape[ChatResponse]:
    """A chat reply's responses: parsed for tool calls when the call may make them."""
    if call.tools.format is None:
        return Shape(chat_response)
    return Shape(chat_response, call.tools.format, functools.partial(last_tool_response, call.tools))
