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
from collections.abc import Sequence
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
from rag_lookahead import (
    DEFAULT_MODEL,
    GenerationParams,
    LookaheadConfig,
    LookaheadEngine,
    TextStream,
)
from rag_lookahead.interface import Engine
from rag_lookahead.models import builtin_name

__all__ = ["LookaheadLLM"]

_GENERATION_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationParams))
# What a call takes as keyword arguments; `documents` and `scope` are read by `_open`.
_CALL_OPTIONS = _GENERATION_FIELDS | {"stop", "max_tokens", "documents", "scope"}
# Roles some chat templates do not know, mapped to the ones every template has.
_ROLE_ALIASES = {
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.DEVELOPER: "system",
}
_PLAIN_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


class LookaheadLLM(CustomLLM):
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
        completion = self._open(self._chat_prompt(messages), kwargs).complete()
        return chat_response(completion.text, None, usage(completion.stats))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return responses(self._open(self._chat_prompt(messages), kwargs), chat_response)

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
        stream = await self._aopen(self._chat_prompt(messages), kwargs)
        return await alast(aresponses(stream, chat_response))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        stream = await self._aopen(self._chat_prompt(messages), kwargs)
        return aresponses(stream, chat_response)

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
        return [
            {"role": _ROLE_ALIASES.get(m.role, m.role.value), "content": m.content or ""} for m in messages
        ]

    def _open(self, prompt: Any, kwargs: dict[str, Any]) -> TextStream:
        """Start generating: nothing runs until the stream is iterated."""
        kwargs = dict(kwargs)
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
            stream = engine.stream(prompt, params, documents=documents, scope=scope)
        except BaseException:
            if claim is not None:
                claim.release()
            raise
        if claim is not None:
            weakref.finalize(stream, claim.release)  # the run's scope stays open while it is read
        return stream

    async def _aopen(self, prompt: Any, kwargs: dict[str, Any]) -> TextStream:
        # Tokenizing a long prompt is work too; `to_thread` copies the context, scope included.
        return await asyncio.to_thread(self._open, prompt, kwargs)

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
