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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

from rag_lookahead.interface import Scope, scope_key

__all__ = ["ActiveScope", "active_scope", "scope_key", "use_scope"]


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
