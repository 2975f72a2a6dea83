"""`LookaheadQueryEngine`: a `RetrieverQueryEngine` whose retrieved nodes all feed the trie.

A synthesizer packs only what fits into each prompt (compact) or spreads the nodes over several
calls (refine), so no single LLM call sees every retrieved node. Before synthesis this engine
inserts the text of all retrieved nodes into the LLM's trie as branches owned by the query (a
`DocumentScope`) and publishes that scope to every LLM call synthesis makes (`scoping`). The
branches are eliminated when synthesis is done: at once for a plain response, and for a
streaming one when its generator is exhausted, closed or garbage-collected.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Sequence
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    StreamingResponse,
)
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms.llm import LLM
from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from llama_index.core.settings import Settings

from llama_index.llms.rag_lookahead.base import LookaheadLLM
from llama_index.llms.rag_lookahead.scoping import scope_key, use_scope
from rag_lookahead.interface import Scope

__all__ = ["LookaheadQueryEngine"]

dispatcher = instrument.get_dispatcher(__name__)


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

    # ------------------------------------------------------------------ synthesis in a scope

    def synthesize(
        self,
        query_bundle: QueryBundle,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
    ) -> RESPONSE_TYPE:
        scope = self._open_scope(nodes, additional_source_nodes)
        try:
            with use_scope(scope_key(self._llm.engine), scope):
                response = super().synthesize(query_bundle, nodes, additional_source_nodes)
        except BaseException:
            scope.close()
            raise
        return _close_after(response, scope_key(self._llm.engine), scope)

    async def asynthesize(
        self,
        query_bundle: QueryBundle,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
    ) -> RESPONSE_TYPE:
        scope = await asyncio.to_thread(self._open_scope, nodes, additional_source_nodes)
        try:
            # Tasks the synthesizer spawns copy this context, so they see the scope too.
            with use_scope(scope_key(self._llm.engine), scope):
                response = await super().asynthesize(query_bundle, nodes, additional_source_nodes)
        except BaseException:
            scope.close()
            raise
        return _close_after(response, scope_key(self._llm.engine), scope)

    # The base class's `_query` calls the synthesizer directly; these go through `synthesize`.

    @dispatcher.span
    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as query_event:
            nodes = self.retrieve(query_bundle)
            response = self.synthesize(query_bundle, nodes)
            query_event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    @dispatcher.span
    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as query_event:
            nodes = await self.aretrieve(query_bundle)
            response = await self.asynthesize(query_bundle, nodes)
            query_event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    def _open_scope(
        self,
        nodes: Sequence[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None,
    ) -> Scope:
        everything = [*nodes, *(additional_source_nodes or ())]
        # The text as the synthesizer shows it to the LLM, metadata lines included.
        texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in everything]
        return self._llm.engine.scope(texts)


def _close_after(response: RESPONSE_TYPE, trie: Any, scope: Scope) -> RESPONSE_TYPE:
    """Close ``scope`` now, or when a streaming response's generator is done with."""
    if isinstance(response, StreamingResponse) and response.response_gen is not None:
        response.response_gen = _scoped(response.response_gen, trie, scope)
        weakref.finalize(response.response_gen, scope.close)  # never iterated, then dropped
    elif isinstance(response, AsyncStreamingResponse) and response.response_gen is not None:
        response.response_gen = _ascoped(response.response_gen, trie, scope)
        weakref.finalize(response.response_gen, scope.close)
    else:
        scope.close()
    return response


# A streaming synthesizer may make its LLM call only when its generator is first advanced,
# long after `synthesize` returned: each advance runs with the scope published again.


def _scoped(tokens: Iterator[str], trie: Any, scope: Scope) -> Generator[str, None, None]:
    try:
        while True:
            with use_scope(trie, scope):
                token = next(tokens, _DONE)
            if token is _DONE:
                return
            yield token  # outside the block: the consumer's own context stays untouched
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()  # ends the LLM call now rather than when it is garbage-collected
        scope.close()


async def _ascoped(tokens: AsyncIterator[str], trie: Any, scope: Scope) -> AsyncGenerator[str, None]:
    try:
        while True:
            with use_scope(trie, scope):
                token = await anext(tokens, _DONE)
            if token is _DONE:
                return
            yield token
    finally:
        aclose = getattr(tokens, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
        finally:
            scope.close()


_DONE: Any = object()
