"""The document scope of the query being synthesized, as seen by the LLM calls it makes.

A LlamaIndex synthesizer makes one or several LLM calls (compact, refine, tree summarize) and
never passes them the retrieved nodes, only the text it packed into each prompt. The query
engine therefore opens one `DocumentScope` with every retrieved node and publishes it here;
each `LookaheadLLM` call made while it is published drafts from it.

A `contextvars.ContextVar` carries it because that is what follows the call into the places
LlamaIndex runs LLM calls: the same thread, asyncio tasks (which copy the context when they are
created), ``asyncio.to_thread``, and LlamaIndex's own ``asyncio_run`` worker thread (which runs
the coroutine in a copy of the caller's context). Plain ``threading.Thread`` workers do not
inherit it; pass ``scope=`` to the LLM call explicitly there.

`open_stream` resolves a call's scope from its three sources, first found first: the call's
own ``scope=``, the scope published here, the nodes retrieved earlier in the call's run
(`RetrievalScopes`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

from llama_index.llms.rag_lookahead.retrievals import Claim, RetrievalScopes
from rag_lookahead import TextStream
from rag_lookahead.interface import Engine, Scope, scope_key
from rag_lookahead.protocol import CallPlan

__all__ = ["ActiveScope", "active_scope", "open_stream", "scope_key", "use_scope"]


class ActiveScope(NamedTuple):
    """A published scope and the trie it lives in (an LLM only uses a scope of its own trie)."""

    trie: Any
    scope: Scope


_ACTIVE: ContextVar[ActiveScope | None] = ContextVar("rag_lookahead_scope", default=None)


def active_scope(trie: Any | None = None) -> Scope | None:
    """The open scope published in this context, if any (and if given, only one of ``trie``)."""
    active = _ACTIVE.get()
    if active is None or active.scope.closed:
        return None
    if trie is not None and active.trie is not trie:
        return None
    return active.scope


@contextmanager
def use_scope(trie: Any, scope: Scope) -> Iterator[Scope]:
    """Publish ``scope`` to LLM calls made inside the block (it is not closed on exit)."""
    token = _ACTIVE.set(ActiveScope(trie, scope))
    try:
        yield scope
    finally:
        _ACTIVE.reset(token)


def open_stream(
    engine: Engine,
    call_engine: Engine,
    plan: CallPlan,
    scope: Scope | None = None,
    retrievals: RetrievalScopes | None = None,
) -> TextStream:
    """Start ``plan`` on ``call_engine`` (``engine`` or its plain twin), drafting from
    ``scope``, else from the scope published for ``engine``'s trie, else from the nodes
    ``retrievals`` saw earlier in the run; nothing runs until the stream is iterated."""
    claim: Claim | None = None
    if scope is None and call_engine.drafts_from_documents:
        # A query's nodes reach the drafts only where the engine drafts from documents; a
        # vLLM server sees its prompt alone (and a refine prompt may show only some nodes).
        scope = active_scope(scope_key(engine))
        if scope is None and retrievals is not None:
            claim = retrievals.claim(engine)  # nodes retrieved earlier in this run
            scope = claim.scope if claim is not None else None
    try:
        stream = call_engine.stream(plan.prompt, plan.params, scope=scope, **plan.stream_kwargs())
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    if claim is not None:
        weakref.finalize(stream, claim.release)  # the run's scope stays open while it is read
    return stream
