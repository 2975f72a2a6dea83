"""Retrieved documents into the trie for the rest of their chain run.

`LookaheadCallbackHandler` watches a chain run. It records which runs belong to which top-level
run (from each run's ``parent_run_id``) and keeps the documents any retriever returns inside it.
When a lookahead model is called later in that run, it asks the handler for the run's documents:
they are inserted as branches of a `DocumentScope` owned by the run (once per trie, see
`RunScopes`; later retrievals are added), and the scope is closed when the top-level run ends
or fails. Documents of a run that never calls a lookahead model are never inserted, and are
forgotten at its end.

A model finds its run through LangChain's own callback plumbing (`run_link`): the handlers and
parent run id of its run manager, or of the runnable config of the code calling it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    BaseCallbackHandler,
    BaseCallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.documents import Document
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config

from rag_lookahead.interface import Engine, Scope
from rag_lookahead.protocol import RunScopes

__all__ = ["LookaheadCallbackHandler", "RunLink", "run_link", "with_retrieved_documents"]

Input = TypeVar("Input")
Output = TypeVar("Output")


@dataclass
class _TopRun:
    members: list[UUID] = field(default_factory=list)
    scopes: RunScopes = field(default_factory=RunScopes)


class LookaheadCallbackHandler(BaseCallbackHandler):
    """Makes documents retrieved in a chain run draftable by the lookahead models of that run.

    Attach it to the chain (``chain.with_config(callbacks=[LookaheadCallbackHandler()])`` or
    `with_retrieved_documents`); one handler serves any number of concurrent runs and models.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._top: dict[UUID, UUID] = {}  # each live run -> the top-level run it belongs to
        self._runs: dict[UUID, _TopRun] = {}

    # ------------------------------------------------------------------ what models ask

    def scope_for(self, parent_run_id: UUID, engine: Engine) -> Scope | None:
        """The scope holding the documents retrieved so far in ``parent_run_id``'s run, if any."""
        with self._lock:
            top = self._top.get(parent_run_id)
            run = self._runs.get(top) if top is not None else None
            if run is None or not run.scopes.documents:
                return None
            return run.scopes.scope(engine)

    @property
    def active_runs(self) -> int:
        """Top-level runs being tracked (0 once every run has ended)."""
        with self._lock:
            return len(self._runs)

    # ------------------------------------------------------------------ bookkeeping

    def _start(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        with self._lock:
            top = self._top.get(parent_run_id) if parent_run_id is not None else None
            if top is None:  # no parent, or one this handler never saw: a top-level run
                top = run_id
                self._runs[top] = _TopRun()
            self._top[run_id] = top
            self._runs[top].members.append(run_id)

    def _end(self, run_id: UUID) -> None:
        with self._lock:
            if self._top.get(run_id) != run_id:
                return  # a nested run: forgotten with its top-level run
            run = self._runs.pop(run_id)
            for member in run.members:
                self._top.pop(member, None)
        run.scopes.close()  # outside the lock: closing waits for the engine

    def _retrieved(self, run_id: UUID, documents: Sequence[Document]) -> None:
        with self._lock:
            top = self._top.get(run_id)
            if top is None or top == run_id:
                return  # a retriever called on its own: no model of its run will draft
            self._runs[top].scopes.add(doc.page_content for doc in documents)

    # ------------------------------------------------------------------ callbacks

    # Every run this handler sees starts and ends the same way, whatever its kind; the
    # arguments besides the run ids (inputs, prompts, documents...) do not matter here.

    def _on_start(self, *args: Any, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._start(run_id, parent_run_id)

    def _on_end(self, *args: Any, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    on_chain_start = on_retriever_start = on_llm_start = on_chat_model_start = on_tool_start = _on_start
    on_chain_end = on_chain_error = on_retriever_error = _on_end
    on_llm_end = on_llm_error = on_tool_end = on_tool_error = _on_end

    def on_retriever_end(self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any) -> None:
        self._retrieved(run_id, documents)
        self._end(run_id)


def with_retrieved_documents(runnable: Runnable[Input, Output]) -> Runnable[Input, Output]:
    """``runnable`` with a `LookaheadCallbackHandler` attached to every run of it."""
    return runnable.with_config(callbacks=[LookaheadCallbackHandler()])


@dataclass(frozen=True)
class RunLink:
    """What one model call knows of the chain run around it: its handlers and parent run."""

    handlers: tuple[BaseCallbackHandler, ...] = ()
    parent_run_id: UUID | None = None

    def scope(self, engine: Engine) -> Scope | None:
        """The scope of documents retrieved earlier in this run, inserted for ``engine``."""
        if self.parent_run_id is None or not engine.drafts_from_documents:
            return None  # plain decoding (or vLLM) never drafts from them: inserting would be wasted work
        for handler in self.handlers:
            if isinstance(handler, LookaheadCallbackHandler):
                scope = handler.scope_for(self.parent_run_id, engine)
                if scope is not None:
                    return scope
        return None


def run_link(
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
) -> RunLink:
    """The run around a model call, from its run manager or else the caller's config.

    LangChain passes no run manager to a chat model's ``_stream``; the config that the enclosing
    runnable set for its children (``ensure_config``) then names the same parent run.
    """
    if run_manager is not None:
        return RunLink(tuple(run_manager.handlers), run_manager.parent_run_id)
    callbacks = ensure_config().get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        return RunLink(tuple(callbacks.handlers), callbacks.parent_run_id)
    return RunLink()
