"""`LookaheadQueryEngine`: a `RetrieverQueryEngine` whose retrieved nodes all feed the trie.

Any query engine over a `LookaheadLLM` drafts from its retrieved nodes through
`RetrievalScopes`, which sees every retrieval of a run. This one is the convenience for the
common case with a tighter lifecycle: the nodes the query retrieved (after its node
postprocessors) are inserted into the LLM's trie as one `DocumentScope` right after retrieval,
published to every LLM call synthesis makes (`scoping`), and eliminated when synthesis is
done: at once for a plain response, and for a streaming one as soon as its generator is
exhausted or closed (or garbage-collected), not when the response object goes away.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    StreamingResponse,
)
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms.llm import LLM
from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from llama_index.core.settings import Settings

from llama_index.llms.rag_lookahead.base import LookaheadLLM
from llama_index.llms.rag_lookahead.generators import aadvanced_in, advanced_in
from llama_index.llms.rag_lookahead.scoping import scope_key, use_scope
from rag_lookahead.interface import Scope

__all__ = ["LookaheadQueryEngine"]

# The query under way in this context: its engine's `id` (a query engine that another one's
# retriever queries fills its own) and its scope.
_QUERY: ContextVar[tuple[int, Scope] | None] = ContextVar("rag_lookahead_query", default=None)


class LookaheadQueryEngine(RetrieverQueryEngine):
    """Retrieve, then synthesize with every retrieved node in the `LookaheadLLM`'s trie.

    Build it like a `RetrieverQueryEngine`, in one line:

    ``LookaheadQueryEngine.from_index(index, llm=LookaheadLLM(), similarity_top_k=4)`` takes
    the same keyword arguments as ``index.as_query_engine``; ``from_args(retriever, llm=...)``
    those of `RetrieverQueryEngine.from_args` (``response_mode``, ``streaming``, ...).
    The answers are those of the same `RetrieverQueryEngine`; only the decoding is faster.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        response_synthesizer: BaseSynthesizer | None = None,
        node_postprocessors: list[BaseNodePostprocessor] | None = None,
        callback_manager: CallbackManager | None = None,
        llm: LookaheadLLM | None = None,
    ) -> None:
        """As `RetrieverQueryEngine`; ``llm`` defaults to the synthesizer's LLM."""
        super().__init__(retriever, response_synthesizer, node_postprocessors, callback_manager)
        # `BaseSynthesizer` keeps its LLM private and offers no accessor.
        found: Any = llm or getattr(self._response_synthesizer, "_llm", None)
        if isinstance(found, StructuredLLM):  # a structured-output wrapper: the LLM under it
            found = found.llm
        if not isinstance(found, LookaheadLLM):
            raise TypeError(
                f"LookaheadQueryEngine needs a LookaheadLLM to synthesize with, got {type(found).__name__}"
            )
        self._llm = found

    @classmethod
    def from_args(  # type: ignore[override]
        cls, retriever: BaseRetriever, llm: LLM | None = None, **kwargs: Any
    ) -> LookaheadQueryEngine:
        """`RetrieverQueryEngine.from_args` with a `LookaheadLLM` (default: ``Settings.llm``)."""
        engine = super().from_args(retriever, llm=llm or Settings.llm, **kwargs)
        assert isinstance(engine, LookaheadQueryEngine)
        return engine

    @classmethod
    def from_index(cls, index: BaseIndex, llm: LLM | None = None, **kwargs: Any) -> LookaheadQueryEngine:
        """What ``index.as_query_engine(llm=llm, **kwargs)`` builds, as a `LookaheadQueryEngine`."""
        return cls.from_args(index.as_retriever(**kwargs), llm=llm, **kwargs)

    @property
    def llm(self) -> LookaheadLLM:
        """The LLM whose trie receives the retrieved nodes."""
        return self._llm

    def with_retriever(self, retriever: BaseRetriever) -> LookaheadQueryEngine:
        return LookaheadQueryEngine(
            retriever,
            self._response_synthesizer,
            self._node_postprocessors,
            self.callback_manager,
            llm=self._llm,
        )

    # ------------------------------------------------------------------ the query's scope

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self._synthesis() as scope:
            response = super()._query(query_bundle)
        return _close_after(response, scope_key(self._llm.engine), scope)

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        # Tasks the synthesizer spawns copy this context, so they see the scope too.
        with self._synthesis() as scope:
            response = await super()._aquery(query_bundle)
        return _close_after(response, scope_key(self._llm.engine), scope)

    def retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        nodes = super().retrieve(query_bundle)
        scope = self._query_scope()
        if scope is not None:
            scope.add(_texts(nodes))
        return nodes

    async def aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        nodes = await super().aretrieve(query_bundle)
        scope = self._query_scope()
        if scope is not None:
            await asyncio.to_thread(scope.add, _texts(nodes))  # tokenizing is work too
        return nodes

    @contextmanager
    def _synthesis(self) -> Iterator[Scope]:
        """The query's scope, published to the LLM calls inside (`retrieve` fills it); it is
        closed here only when the query fails."""
        scope = self._llm.engine.scope()
        token = _QUERY.set((id(self), scope))
        try:
            with use_scope(scope_key(self._llm.engine), scope):
                yield scope
        except BaseException:
            scope.close()
            raise
        finally:
            _QUERY.reset(token)

    def _query_scope(self) -> Scope | None:
        """The scope of this engine's query under way here, if any."""
        query = _QUERY.get()
        return query[1] if query is not None and query[0] == id(self) else None


def _texts(nodes: Sequence[NodeWithScore]) -> list[str]:
    # The text as the synthesizer shows it to the LLM, metadata lines included.
    return [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]


def _close_after(response: RESPONSE_TYPE, trie: Any, scope: Scope) -> RESPONSE_TYPE:
    """Close ``scope`` now, or when a streaming response's generator is done with."""
    # A streaming synthesizer may make its LLM call only when its generator is first advanced,
    # long after the query returned: each advance runs with the scope published again.
    context = functools.partial(use_scope, trie, scope)
    if isinstance(response, StreamingResponse) and response.response_gen is not None:
        response.response_gen = advanced_in(response.response_gen, context, scope.close)
        weakref.finalize(response.response_gen, scope.close)  # never iterated, then dropped
    elif isinstance(response, AsyncStreamingResponse) and response.response_gen is not None:
        response.response_gen = aadvanced_in(response.response_gen, context, scope.close)
        weakref.finalize(response.response_gen, scope.close)
    else:
        scope.close()
    return response
