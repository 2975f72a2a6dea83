"""Nodes retrieved anywhere in a LlamaIndex run, as documents that run's LLM calls draft from.

Chat engines, routers, agents and user code call retrievers with no `LookaheadQueryEngine`
around them. LlamaIndex's instrumentation reports every retrieval (`RetrievalEndEvent`, with
the span it happened in) and every span (a chat turn, an agent's workflow run, each step, tool
call and LLM call inside it) with its parent span. `RetrievalScopes` follows that tree: the
nodes of a retrieval belong to the outermost open span around it (the *run*), and a
`LookaheadLLM` call later in the same run drafts from them through a `DocumentScope` owned by
the run. The scope is opened at the run's first LLM call that finds nodes (a run that never
calls a lookahead model never tokenizes them), grows with later retrievals, and is closed when
the run's span has ended and none of its LLM calls is still decoding; a streaming response the
run returned (a chat engine's or a query engine's, decoded only as it is read) keeps the run
open until the response object is dropped. Concurrent runs are separate spans, hence separate
scopes; a span's parent follows asyncio tasks and LlamaIndex's own threads (context copies),
but not a plain ``threading.Thread``, whose calls start runs of their own.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.chat_engine.types import StreamingAgentChatResponse
from llama_index.core.instrumentation.dispatcher import Dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.schema import MetadataMode, NodeWithScore

from llama_index.llms.rag_lookahead.generators import aadvanced_in, advanced_in
from rag_lookahead.interface import Engine, Scope
from rag_lookahead.protocol import RunScopes

__all__ = ["Claim", "RetrievalScopes"]

_STREAMING_RESPONSES = (StreamingResponse, AsyncStreamingResponse, StreamingAgentChatResponse)
# The run whose streaming response's generator is being advanced (by whoever reads it).
_DEFERRED: ContextVar[str | None] = ContextVar("rag_lookahead_deferred_run", default=None)
# One tracker per dispatcher: LLMs created at once in several threads must not attach two.
_ATTACH_LOCK = threading.Lock()


@dataclass
class _Run:
    """The nodes retrieved so far in one run, and the scopes they were inserted into."""

    scopes: RunScopes = field(default_factory=RunScopes)
    holds: int = 0  # LLM calls of the run still open
    ended: bool = False  # the run's span has exited (or was dropped)


@dataclass(frozen=True)
class Claim:
    """A run's scope for one LLM call, held open until `release` (idempotent) is called."""

    scope: Scope
    release: Callable[[], None]


class RetrievalScopes:
    """Tracks retrievals per run and hands their scope to the `LookaheadLLM` calls of the run.

    ``RetrievalScopes.attach()`` returns the tracker attached to LlamaIndex's root dispatcher,
    attaching one on first use; every `LookaheadLLM` does so unless built with
    ``track_retrievals=False``. `detach` stops tracking (scopes of runs still open stay usable
    until they end).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: dict[str, str] = {}  # each open span -> the outermost open span around it
        self._runs: dict[str, _Run] = {}  # by root span, once the run has retrieved something
        self._followed: weakref.WeakSet[Any] = weakref.WeakSet()  # generators published from
        self._dispatcher: Dispatcher | None = None
        self._handler = _Handler(self)

    @classmethod
    def attach(cls, dispatcher: Dispatcher | None = None) -> RetrievalScopes:
        """The tracker on ``dispatcher`` (default: the root one, which sees every span)."""
        target = dispatcher if dispatcher is not None else instrument.get_dispatcher()
        with _ATTACH_LOCK:
            for handler in target.span_handlers:
                if isinstance(handler, _Handler):
                    return handler.tracker
            tracker = cls()
            target.add_span_handler(tracker._handler)
            target.add_event_handler(tracker._handler)
            tracker._dispatcher = target
            return tracker

    def detach(self) -> None:
        """Stop receiving spans and events (idempotent)."""
        with _ATTACH_LOCK:
            if self._dispatcher is not None:
                self._dispatcher.span_handlers.remove(self._handler)
                self._dispatcher.event_handlers.remove(self._handler)
                self._dispatcher = None

    @property
    def attached(self) -> bool:
        return self._dispatcher is not None

    @property
    def active_runs(self) -> int:
        """Runs holding retrieved nodes that have not ended (0 once every run is over)."""
        with self._lock:
            return len(self._runs)

    # ------------------------------------------------------------------ what LLM calls ask

    def claim(self, engine: Engine, span_id: str | None = None) -> Claim | None:
        """The scope of the nodes retrieved so far in the run of ``span_id`` (default: the
        current span), inserted for ``engine``'s trie; ``None`` if the run retrieved nothing."""
        span = span_id if span_id is not None else active_span_id.get()
        with self._lock:
            # A streaming response's generator advanced by its reader: the run that returned it.
            root = _DEFERRED.get() if span_id is None else None
            if root is None or root not in self._runs:
                root = self._root.get(span) if span is not None else None
            run = self._runs.get(root) if root is not None else None
            if root is None or run is None or not run.scopes.documents:
                return None
            run.holds += 1  # from here on the run's scopes stay open
        release = _Once(lambda: self._release(root))
        try:  # outside the tracker's lock: tokenizing would stall every span of the process
            return Claim(run.scopes.scope(engine), release)
        except BaseException:
            release()
            raise

    # ------------------------------------------------------------------ bookkeeping

    def _release(self, root: str, span: str | None = None) -> None:
        with self._lock:
            if span is not None and span != root:
                self._root.pop(span, None)  # a span kept for the generation its result defers
            run = self._runs.get(root)
            if run is None:
                return
            run.holds -= 1
            finished = self._pop_if_over(root, run)
        _close(finished)

    def _enter(self, span: str, parent: str | None) -> None:
        with self._lock:
            # A parent this tracker never saw, or that has already exited, starts a new run.
            self._root[span] = self._root.get(parent, span) if parent is not None else span

    def _exit(self, span: str, result: Any = None) -> None:
        with self._lock:
            root = self._root.get(span)
            run = self._runs.get(root) if root is not None else None
            if root is not None and run is not None and _defers_generation(result):
                # A streaming response decodes after its span exited: in spans under this one
                # (a chat engine's thread or task), or when its reader advances the generator.
                # The span stays in its run, and the run open, while the response is alive.
                run.holds += 1
                weakref.finalize(result, self._release, root, span)
                self._follow_generator(result, root)
            elif span != root or run is None:
                self._root.pop(span, None)
            if run is not None and span == root:
                run.ended = True
                finished = self._pop_if_over(span, run)
            else:
                finished = None
        _close(finished)  # outside the lock: closing waits for the engine's trie

    def _follow_generator(self, response: Any, root: str) -> None:
        """Publish ``root`` as the run of every advance of ``response``'s token generator."""
        gen = getattr(response, "response_gen", None)
        if not isinstance(response, (StreamingResponse, AsyncStreamingResponse)) or gen is None:
            return
        if gen in self._followed:
            return  # an inner span of the run already did
        context = functools.partial(_deferred, root)
        # Typed as the response's own generator: its items pass through unchanged.
        follower: Any = aadvanced_in(gen, context) if inspect.isasyncgen(gen) else advanced_in(gen, context)
        self._followed.add(follower)
        response.response_gen = follower

    def _pop_if_over(self, root: str, run: _Run) -> _Run | None:
        if run.ended and run.holds <= 0:
            self._root.pop(root, None)
            return self._runs.pop(root)
        return None

    def _retrieved(self, span: str | None, nodes: Sequence[NodeWithScore]) -> None:
        # The text as synthesizers and chat engines show it to the LLM, metadata lines included.
        texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]
        with self._lock:
            root = self._root.get(span) if span is not None else None
            if root is None or root == span:
                return  # a retriever called on its own: no LLM call of its run will follow
            self._runs.setdefault(root, _Run()).scopes.add(texts)


@contextmanager
def _deferred(root: str) -> Iterator[None]:
    """Publish ``root`` as the run of what happens inside."""
    token = _DEFERRED.set(root)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def _defers_generation(result: Any) -> bool:
    """Whether ``result`` generates after its span has exited (and can be weakly referenced)."""
    lazy = (
        isinstance(result, _STREAMING_RESPONSES) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    )
    try:
        return lazy and weakref.ref(result) is not None
    except TypeError:
        return False


def _close(run: _Run | None) -> None:
    if run is not None:
        run.scopes.close()


class _Once:
    """A callable that runs ``action`` on its first call only: a `Claim` released by hand and
    then by its stream's garbage collection counts once."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            action, self._action = self._action, None
        if action is not None:
            action()


class _Handler(BaseSpanHandler[Any], BaseEventHandler):
    """Forwards span starts and ends, and the nodes of each retrieval, to the tracker.

    It keeps no spans of its own: the base class's hooks forward and return no span, so that
    its bookkeeping stays unused.
    """

    _tracker: RetrievalScopes = PrivateAttr()

    def __init__(self, tracker: RetrievalScopes) -> None:
        super().__init__()
        self._tracker = tracker

    @property
    def tracker(self) -> RetrievalScopes:
        return self._tracker

    @classmethod
    def class_name(cls) -> str:
        return "RetrievalScopesHandler"

    def new_span(self, id_: str, *args: Any, parent_span_id: str | None = None, **kwargs: Any) -> None:
        self._tracker._enter(id_, parent_span_id)

    def prepare_to_exit_span(self, id_: str, *args: Any, result: Any | None = None, **kwargs: Any) -> None:
        self._tracker._exit(id_, result)

    def prepare_to_drop_span(self, id_: str, *args: Any, **kwargs: Any) -> None:
        self._tracker._exit(id_)

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, RetrievalEndEvent):
            self._tracker._retrieved(event.span_id, event.nodes)
