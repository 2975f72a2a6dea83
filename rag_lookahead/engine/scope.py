"""Documents that several generation calls draft from, until the scope is closed.

A RAG query may make several model calls (LangChain runs, LlamaIndex refine/compact), and its
retrieved documents should feed all of them and then leave the trie. A scope inserts them once,
owned by the scope, and eliminates them on `close` (or leaving a ``with`` block, or when the
scope is garbage-collected unclosed). Calls draft from a scope's documents only when given it.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rag_lookahead.drafting.compose import TEXT_SLICE
from rag_lookahead.drafting.trie import TokenTrie

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["DocumentScope", "ScopeLifecycle", "document_texts"]


def document_texts(documents: Iterable[str]) -> list[str]:
    """``documents`` as a list of texts: one string is one document, not its characters."""
    items = [documents] if isinstance(documents, str) else documents
    try:
        texts = list(items)
    except TypeError:
        raise TypeError(f"documents must be strings, got {type(documents).__name__}") from None
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"documents must be strings, got {type(text).__name__}")
    return texts


class ScopeLifecycle:
    """What every engine's scope does alike: it closes once, when told to, at the end of a
    ``with`` block, or when it is garbage-collected unclosed."""

    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finaliser (interpreter shutdown)
            self.__exit__(None, None, None)


class DocumentScope(ScopeLifecycle):
    """Document branches owned by one query, visible to the calls that are passed this scope.

    Args:
        trie: The trie the branches go into.
        tokenize: A document's token ids.
        run: Runs a slice of the inserts and returns its result: the engine's model thread's
            `ModelThread.call`, so that its running calls step between two slices of a long
            document rather than wait for all of it (by default, here and now).
    """

    def __init__(
        self,
        trie: TokenTrie,
        tokenize: Callable[[str], list[int]],
        run: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self.owner = f"scope-{uuid.uuid4().hex}"
        self._trie = trie
        self._tokenize = tokenize
        self._run: Callable[[Callable[[], Any]], Any] = run if run is not None else _here
        self._sequences: list[list[int]] = []
        self._closed = False

    @property
    def trie(self) -> TokenTrie:
        """The trie holding this scope's branches (that of the engine that opened it)."""
        return self._trie

    key = trie  # its `scope_key`: the engine that opened it, and that engine's variants, use it

    @property
    def sequences(self) -> Sequence[Sequence[int]]:
        """The token ids of the documents added so far."""
        return tuple(self._sequences)

    def add(self, documents: Iterable[str]) -> None:
        """Insert ``documents`` as branches owned by this scope, a slice at a time (`run`): a
        call given the scope meanwhile may draft from some of them already, which changes no
        answer; those it pools into its own drafters (`sequences`) are those added before."""
        if self._closed:
            raise RuntimeError("this document scope is closed; open a new one")
        sequences = [self._tokenize(text) for text in document_texts(documents) if text]
        width = self._trie.ngram_length
        step = max(1, TEXT_SLICE // width)  # each token counts ``width`` nodes
        for seq in sequences:
            for start in range(0, len(seq), step):
                # The n-grams starting in this slice end past it.
                self._run(functools.partial(self._insert, seq[start : start + step + width - 1], step))
        self._sequences.extend(sequences)

    def _insert(self, tokens: Sequence[int], starts: int) -> None:
        with self._trie.lock:  # (`close` eliminates under it: a slice after would stay behind)
            if self._closed:
                raise RuntimeError("this document scope was closed while its documents went in")
            self._trie.insert(tokens, self.owner, starts=starts)

    def close(self) -> None:
        """Eliminate this scope's branches from the trie (idempotent)."""
        if not self._closed:
            self._closed = True
            self._trie.eliminate(self.owner)


def _here(work: Callable[[], Any]) -> Any:
    return work()
