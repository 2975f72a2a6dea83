"""Settings, engine and call handling shared by `ChatLookahead` and `LookaheadLLM`.

Both models are thin adapters over an engine's ``stream`` (a local `LookaheadEngine`, or a
`ServerEngine` driving a vLLM, SGLang or OpenAI-compatible server): a call's settings and
LangChain arguments are one request mapping, planned by the core (`rag_lookahead.protocol`, as
the HTTP server plans its requests), and `_open` returns the plan and the engine's text pieces
followed by the call's `DecodeStats`. Everything else is built on that one iterator: each
model's chunks (`_chunks`), streamed and reported alike for both (`_stream`, `_astream`), and
its blocking calls.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, ClassVar, Literal, TypeVar, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.language_models import LangSmithParams
from langchain_core.outputs import ChatGenerationChunk, GenerationChunk
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator
from typing_extensions import Self

from langchain_rag_lookahead.callbacks import RunLink, run_link
from langchain_rag_lookahead.tool_results import tool_result_documents
from rag_lookahead import DecodeStats, LookaheadConfig
from rag_lookahead.frontends import EngineSource
from rag_lookahead.interface import Engine
from rag_lookahead.loading import LoadKeywords, LoadOptions
from rag_lookahead.prompts import Prompt
from rag_lookahead.protocol import (
    FINISH_REASONS,
    CallKind,
    CallPlan,
    RequestError,
    plan_call,
    within_deadline,
)
from rag_lookahead.remote import ServerKind
from rag_lookahead.streaming import StreamChunk, aiterate

__all__ = ["CALL_OPTIONS", "LookaheadSettings", "Piece", "areported", "reported", "run_config", "usage"]

#: The settings that are a call's options too (``llm.invoke(x, max_tokens=32)``), besides ``stop``:
#: a call's request starts from them (see `rag_lookahead.protocol.OPTION_KEYS` for the rest).
CALL_OPTIONS = (
    *("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed"),
    *("logprobs", "top_logprobs"),
)

# What LangChain's `invoke` passes its run from the config, by the name a call's keyword has.
_RUN_KEYWORDS = ("callbacks", "tags", "metadata", "run_name", "run_id")

#: One item of `LookaheadSettings._open`: each step's chunk (its text and, when asked for, its
#: tokens' log probabilities), then the call's stats last.
Piece = StreamChunk | DecodeStats
C = TypeVar("C", GenerationChunk, ChatGenerationChunk)  # a chunk of either model's reply

DocumentLike = str | Document

# The loading options among the fields (`LoadOptions` besides ``model``, and ``progress``,
# which is the front end's: `EngineSource.progress`).
_LOAD_FIELDS = tuple(name for name in LoadKeywords.__annotations__ if name != "progress")


class LookaheadSettings(BaseModel):
    """Fields and engine handling common to the chat model and the completion model."""

    _ls_model_type: ClassVar[Literal["chat", "llm"]] = "chat"  # LangSmith's name for the kind

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())

    model: str | None = Field(
        default=None,
        description="A local model directory, or a Hugging Face id already in the local cache; "
        "None loads the embedded SmolLM2-135M-Instruct. Nothing is ever downloaded.",
    )
    engine: Engine | None = Field(
        default=None,
        exclude=True,
        description="An existing engine to use: a `rag_lookahead.LookaheadEngine` (its model, "
        "tokenizer, chat template variables and trie) or a `rag_lookahead.remote.ServerEngine`; "
        "replaces `model`, the loading options and `base_url`.",
    )
    base_url: str | None = Field(
        default=None,
        description="Drive an OpenAI-compatible server (vLLM, SGLang...) at this API root, e.g. "
        "'http://localhost:8000/v1', instead of a local model; `model` is then the served "
        "model's name.",
    )
    server_kind: ServerKind = Field(
        default="openai",
        description="With `base_url`: 'vllm', 'sglang', 'rag-lookahead' (`rag-lookahead serve`) or 'openai' "
        "(see `ServerEngine`).",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="With `base_url`: the server's API key. Accepted and unused without it (a "
        "local model needs none), so code written for other chat models runs unchanged.",
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        description="With `base_url`: seconds to wait for the server (default 600). Without it: "
        "seconds a whole call may take; past them the call stops and raises `TimeoutError`.",
    )
    max_retries: int | None = Field(
        default=None,
        ge=0,
        description="With `base_url`: retries on 429, 5xx and timeouts (default 2). Accepted and "
        "unused without it (a local call is not retried).",
    )
    lookahead: bool = Field(
        default=True,
        description="Draft from the trie and verify (True), or decode plainly with the same "
        "model (False). Greedy outputs are token for token the same either way.",
    )
    lookahead_config: LookaheadConfig | None = Field(
        default=None,
        description="Drafting settings (`rag_lookahead.LookaheadConfig`); None: the engine's "
        "own, or the library defaults. Beside an engine, they may differ from its own in per-call "
        "settings only (`rag_lookahead.config.check_variant`).",
    )
    device: str | None = Field(
        default=None,
        description="Where the model runs: 'cpu', 'cuda', 'cuda:1'...; None: the CPU, unless "
        "`model_kwargs` places the model (a device_map, a quantization).",
    )
    dtype: str | None = Field(
        default=None,
        description="Torch dtype name such as 'bfloat16'; None keeps fp32 on CPU and the "
        "checkpoint's dtype elsewhere.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Run model code shipped with the checkpoint (only if trusted)."
    )
    progress: bool = Field(
        default=True,
        description="Show progress bars on standard error, when it is a terminal, while the model "
        "loaded here is converted and its costs measured (the first call's wait).",
    )
    model_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="More arguments for the model's `from_pretrained`: device_map, "
        "quantization_config, attn_implementation, revision, dtype...",
    )
    tokenizer_kwargs: dict[str, Any] | None = Field(
        default=None, description="More arguments for the tokenizer's `from_pretrained`."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="Variables for the chat template, e.g. {'enable_thinking': False} for Qwen3.",
    )
    max_tokens: int = Field(default=256, gt=0, description="Most new tokens per call.")
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        le=2.0,
        description="0 decodes greedily (lossless: the same tokens as plain greedy decoding); "
        "above 0 samples at this temperature.",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(default=None, gt=0, description="Sample among the k likeliest tokens.")
    repetition_penalty: float = Field(default=1.0, gt=0.0, description="HF-style repetition penalty.")
    seed: int | None = Field(default=None, description="Seed for sampling (None: not reseeded).")
    logprobs: bool | None = Field(
        default=None,
        description="Report each new token's log probability (the model's raw distribution) in "
        "`response_metadata['logprobs']`, as ChatOpenAI does: {'content': [{token, logprob, "
        "bytes, top_logprobs}...]}.",
    )
    top_logprobs: int | None = Field(
        default=None, ge=0, le=20, description="With `logprobs`: the most likely tokens per position."
    )
    stop: list[str] | None = Field(
        default=None,
        description="Stop sequences of any length; the output ends just before the first one. "
        "A `stop` passed at call time replaces these.",
    )
    prediction: str | dict[str, Any] | None = Field(
        default=None,
        description="Text every answer is expected to copy (OpenAI's Predicted Outputs: the file "
        "being edited), as a string or OpenAI's {'type': 'content', 'content': ...}; drafted from "
        "first, never changing the answer. A call's `prediction=` replaces it. Its accepted and "
        "rejected tokens are in `response_metadata['lookahead']`.",
    )
    streaming: bool = Field(
        default=False,
        description="Whether `invoke` goes through the streaming path (LangChain's convention). "
        "Every chunk reaches `on_llm_new_token` either way.",
    )

    _resolved: Engine | None = PrivateAttr(default=None)
    _resolve_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @model_validator(mode="after")
    def _check_source(self) -> Self:
        self.engine_source()  # checked now rather than when the first call loads the model
        return self

    # ------------------------------------------------------------------ engine

    def engine_source(self) -> EngineSource:
        """Where the engine comes from, as these settings say (checked; nothing loads)."""
        server: dict[str, Any] = {"kind": None if self.server_kind == "openai" else self.server_kind}
        if self.base_url is not None:  # else accepted and unused, as other chat models' are
            server["api_key"] = self.api_key.get_secret_value() if self.api_key is not None else None
            server["max_retries"] = self.max_retries
        return EngineSource(
            engine=self.engine,
            load=LoadOptions.of(None, self.model, **{name: getattr(self, name) for name in _LOAD_FIELDS}),
            base_url=self.base_url,
            server=server,
            timeout=self.timeout,
            lookahead_config=self.lookahead_config,
            lookahead=self.lookahead,
            progress=self.progress,
        )

    @property
    def model_name(self) -> str:
        """The model's name, for traces and `response_metadata`."""
        return self.engine_source().model_name

    def resolved_config(self) -> LookaheadConfig | None:
        """The drafting settings calls run with (mode ``"off"`` when ``lookahead=False``).

        ``None`` on a server, which drafts by its own settings.
        """
        return self.engine_source().config

    def get_engine(self) -> Engine:
        """The engine calls run on, loading the model on first use (thread-safe)."""
        with self._resolve_lock:
            if self._resolved is None:
                self._resolved = self.engine_source().resolve()
            return self._resolved

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """Model and lookahead settings: what makes two instances answer alike."""
        config = self.resolved_config()
        return {
            "model_name": self.model_name,
            "lookahead": self.lookahead,
            **({"base_url": self.base_url} if self.base_url is not None else {}),
            **(dataclasses.asdict(config) if config is not None else {}),
            **{name: getattr(self, name) for name in CALL_OPTIONS},
            "stop": self.stop,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        model = kwargs.get("model")
        params = LangSmithParams(
            ls_provider="rag_lookahead",
            ls_model_name=model if isinstance(model, str) else self.model_name,
            ls_model_type=self._ls_model_type,
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def get_token_ids(self, text: str) -> list[int]:
        """The ids of the tokens in ``text``, by the model's own tokenizer, offline.

        Special tokens are not added; a ``custom_get_token_ids`` given to the model wins.
        """
        custom = getattr(self, "custom_get_token_ids", None)
        if custom is not None:
            return list(custom(text))
        return list(self.get_engine().tokenizer(text, add_special_tokens=False).input_ids)

    # ------------------------------------------------------------------ runs

    # LangChain's `invoke` hands its run the config's callbacks, tags, metadata, name and id,
    # and a call's keyword of the same name a second time (a TypeError); `stream` would take
    # it for a generation option. In every way of starting a run, each joins the config.
    # (`super()` is LangChain's model, after these settings in the models' bases.)

    def invoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        config = run_config(config, kwargs)
        return super().invoke(input, config, stop=stop, **kwargs)  # type: ignore[misc]

    async def ainvoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        config = run_config(config, kwargs)
        return await super().ainvoke(input, config, stop=stop, **kwargs)  # type: ignore[misc]

    def stream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[Any]:
        config = run_config(config, kwargs)
        return super().stream(input, config, stop=stop, **kwargs)  # type: ignore[misc]

    def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        config = run_config(config, kwargs)
        return super().astream(input, config, stop=stop, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------ calls

    # Both models stream alike: their own chunks (`_chunks`), each reported as it comes.

    def _stream(
        self,
        prompt: Any,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[Any]:
        # LangChain reports streamed chunks itself and passes no run manager then.
        return reported(self._chunks(prompt, stop, run_manager, kwargs), run_manager)

    def _astream(
        self,
        prompt: Any,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        return areported(self._chunks(prompt, stop, run_manager, kwargs), run_manager)

    def _chunks(
        self,
        prompt: Any,
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> Iterator[Any]:
        """A call's chunks, of the model's kind: arguments checked now, generated when read."""
        raise NotImplementedError

    def _open(
        self,
        kind: CallKind,
        prompt: Prompt,
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> tuple[CallPlan, Iterator[Piece]]:
        """The call's plan, checked now, and its pieces: they generate when first advanced.

        Everything that depends on the caller's context (the chain run this call belongs to)
        is read here, so the iterator may then run in another thread.
        """
        plan = self._plan(kind, prompt, stop, kwargs)
        return plan, self._pieces(plan, run_link(run_manager))

    def _plan(
        self, kind: CallKind, prompt: Prompt, stop: list[str] | None, kwargs: dict[str, Any]
    ) -> CallPlan:
        """The settings, then the call's options over them, as one request to the core."""
        options = {key: value for key, value in kwargs.items() if value is not None}
        options.pop("stream", None)  # LangChain's own routing flag, not a generation option
        documents = _document_texts(options.pop("documents", None) or ())
        documents += tool_result_documents(prompt)  # an agent's retrieved text, as documents
        settings = {name: getattr(self, name) for name in CALL_OPTIONS}
        request = {**settings, "stop": self.stop, **options, "documents": documents}
        request["prediction"] = _prediction(options.get("prediction", self.prediction))
        if stop is not None:
            request["stop"] = stop  # a call's stops replace the settings'
        try:
            return plan_call(kind, prompt, request, self.get_engine() if kind == "chat" else None)
        except RequestError as err:
            if err.code == "unknown_parameter":
                raise TypeError(f"unexpected call option: {err}") from None
            raise

    def _pieces(self, plan: CallPlan, link: RunLink) -> Iterator[Piece]:
        engine = self.get_engine()
        scope = link.scope(engine)
        with engine.stream(plan.prompt, plan.params, scope=scope, **plan.stream_kwargs()) as stream:
            yield from within_deadline(stream.chunks(), stream, self.engine_source().deadline)
            yield stream.stats

    def _response_metadata(self, stats: DecodeStats) -> dict[str, Any]:
        """``model_name``, ``finish_reason`` and the lookahead stats of a finished call."""
        return {
            "model_name": self.model_name,
            "finish_reason": FINISH_REASONS.get(reason, reason) if (reason := stats.finish_reason) else None,
            "lookahead": stats.as_dict(),
        }


def run_config(config: RunnableConfig | None, kwargs: dict[str, Any]) -> RunnableConfig | None:
    """``config`` with the run keywords among a call's ``kwargs``, taken out of them.

    The call's ``metadata`` is added to the config's, its ``tags`` and ``callbacks`` follow the
    config's lists, its ``run_name`` and ``run_id`` replace the config's.
    """
    given = {key: kwargs.pop(key) for key in _RUN_KEYWORDS if key in kwargs}
    if not given:
        return config
    merged: dict[str, Any] = dict(config or {})
    for key, value in given.items():
        merged[key] = _joined(key, merged.get(key), value)
    return cast(RunnableConfig, merged)


def _joined(key: str, configured: Any, given: Any) -> Any:
    """A run keyword's value, the call's ``given`` joined to the config's."""
    if given is None or configured is None:
        return configured if given is None else given
    if key == "metadata":
        if not isinstance(given, dict):
            raise TypeError(f"metadata is a dict of a run's metadata, got {type(given).__name__}")
        return {**configured, **given}
    if key in ("tags", "callbacks"):
        if not isinstance(given, list) or not isinstance(configured, list):
            raise TypeError(f"{key} given both as a keyword and in the config are lists, to be joined")
        return [*configured, *(item for item in given if key != "tags" or item not in configured)]
    return given  # a name or an id: the call's


def reported(chunks: Iterator[C], run_manager: CallbackManagerForLLMRun | None) -> Iterator[C]:
    """``chunks``, each reported to ``run_manager`` as it comes (``None``: not reported)."""
    for chunk in chunks:
        if run_manager is not None:
            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk


async def areported(
    chunks: Iterator[C], run_manager: AsyncCallbackManagerForLLMRun | None
) -> AsyncIterator[C]:
    """`reported` for async callers: ``chunks`` are advanced in a worker thread."""
    async for chunk in aiterate(chunks):
        if run_manager is not None:
            await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk


def usage(stats: DecodeStats) -> dict[str, Any]:
    """Token counts in LangChain's `UsageMetadata` shape.

    ``input_token_details["cache_read"]``: the prompt's leading tokens whose KV entries were
    reused from an earlier prompt rather than prefilled.
    """
    return {
        "input_tokens": stats.prompt_tokens,
        "output_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
        "input_token_details": {"cache_read": stats.cached_prompt_tokens},
    }


def _prediction(value: Any) -> Any:
    """A prediction as OpenAI's request field: a string is its content."""
    return {"type": "content", "content": value} if isinstance(value, str) else value


def _document_texts(documents: Sequence[DocumentLike] | DocumentLike) -> list[str]:
    texts = []
    for doc in [documents] if isinstance(documents, (str, Document)) else documents:
        if not isinstance(doc, (str, Document)):
            raise TypeError(f"documents are strings or LangChain Documents, got {type(doc).__name__}")
        texts.append(doc.page_content if isinstance(doc, Document) else doc)
    return texts
