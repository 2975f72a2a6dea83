"""What an engine is to the code that drives it: the pipeline and the integrations.

`LookaheadEngine` (one process) and `rag_lookahead.remote.ServerEngine` (a vLLM, SGLang or other
OpenAI-compatible server) both have this surface, so `RagPipeline` and the LangChain and
LlamaIndex adapters take either through ``engine=`` without knowing which it is. Both derive
from `EngineBase`, which gives them what is the same: `complete` over `stream`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rag_lookahead.config import GenerationParams
from rag_lookahead.prompts import Prompt
from rag_lookahead.streaming.stream import Completion, TextStream

__all__ = ["Engine", "EngineBase", "Scope", "check_scope", "scope_key"]


@runtime_checkable
class Scope(Protocol):
    """Documents several calls may draft from, until the scope is closed."""

    @property
    def closed(self) -> bool: ...

    @property
    def key(self) -> Any:
        """The `scope_key` of the engine that opened it: its engine and that engine's
        variants may use it."""
        ...

    def add(self, documents: Iterable[str]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Engine(Protocol):
    """Streaming generation with documents to draft from, and scopes of them.

    A call's ``prediction`` is text its answer is expected to copy (OpenAI's Predicted
    Outputs), drafted from where the engine can; it never changes the answer.
    """

    @property
    def model_name(self) -> str:
        """The model's name, for traces and response metadata."""
        ...

    @property
    def context_window(self) -> int | None: ...

    @property
    def chat(self) -> bool:
        """Whether chat messages are formatted by the model's chat template."""
        ...

    @property
    def drafts_from_documents(self) -> bool:
        """Whether ``documents=`` and scopes reach the drafts (else they would only cost)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, or ``None`` where none is at hand (a server without one)."""
        ...

    def encode(self, prompt: Prompt, *, tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """``prompt``'s token ids, as a call would see them (needs the tokenizer), with
        ``tools`` rendered by the chat template where the engine supports tools."""
        ...

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: Any = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prediction: str | None = None,
        **overrides: Any,
    ) -> TextStream: ...

    def complete(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: Any = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prediction: str | None = None,
        **overrides: Any,
    ) -> Completion: ...

    def scope(self, documents: Iterable[str] = ()) -> Any: ...

    @property
    def supports_plain(self) -> bool:
        """Whether `plain` gives the same model decoding without drafts (else it raises why)."""
        ...

    def plain(self) -> Engine:
        """The same model decoding without drafts (the reference), where `supports_plain`."""
        ...


class EngineBase:
    """What every engine does the same way, over its own `stream`."""

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: Any = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prediction: str | None = None,
        **overrides: Any,
    ) -> TextStream:
        raise NotImplementedError

    def complete(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: Any = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prediction: str | None = None,
        **overrides: Any,
    ) -> Completion:
        """Blocking `stream`: the whole new text, its token ids (where the engine has them)
        and the stats."""
        stream = self.stream(
            prompt, params, documents=documents, scope=scope, tools=tools, prediction=prediction, **overrides
        )
        return stream.complete()


def scope_key(engine: Engine) -> Any:
    """What a scope is tied to: a local engine's trie (shared with its variants, such as its
    plain twin, whose calls may use one scope), or the engine itself for one without a trie (a
    server). Every front end keeps a run's scopes by this key, so that two variants of one
    engine in one run share a scope rather than insert its documents twice."""
    return getattr(engine, "trie", engine)


def check_scope(scope: Scope | None, engine: Engine) -> None:
    """Refuse a call's ``scope`` that ``engine`` cannot use: opened by another engine (its
    documents are where this call can neither draft from nor release them), or closed."""
    if scope is None:
        return
    if getattr(scope, "key", None) is not scope_key(engine):
        raise ValueError("the document scope passed to this call belongs to another engine")
    if scope.closed:
        raise ValueError("the document scope passed to this call is closed")
