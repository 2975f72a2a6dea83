"""`RunScopes`: a run's documents, once each, and its scopes, one per trie, each holding them once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rag_lookahead.protocol import RunScopes


class _Scope:
    def __init__(self) -> None:
        self.documents: list[str] = []
        self.closed = False

    def add(self, documents: Iterable[str]) -> None:
        self.documents.extend(documents)

    def close(self) -> None:
        self.closed = True


class _Engine:
    """An engine as `RunScopes` sees it: a trie (shared by its variants) and scopes over it."""

    def __init__(self, trie: Any) -> None:
        self.trie = trie
        self.opened: list[_Scope] = []

    def scope(self) -> _Scope:
        self.opened.append(_Scope())
        return self.opened[-1]


def test_two_variants_of_one_engine_share_one_scope_and_insert_once() -> None:
    trie = object()
    engine, variant = _Engine(trie), _Engine(trie)
    scopes = RunScopes()
    scopes.add(["a", "b"])
    first = scopes.scope(engine)
    scopes.add(["c"])  # a later retrieval of the same run
    second = scopes.scope(variant)
    assert first is second and not variant.opened
    assert first.documents == ["a", "b", "c"]  # each document once
    assert scopes.scope(engine).documents == ["a", "b", "c"]


def test_a_run_keeps_each_document_once_in_the_order_it_came() -> None:
    scopes = RunScopes()
    assert scopes.documents == []
    scopes.add(["a", "", "b", "a"])
    scopes.add(["b", "c"])
    assert scopes.documents == ["a", "b", "c"]


def test_engines_over_other_tries_get_scopes_of_their_own_and_all_close() -> None:
    one, other = _Engine(object()), _Engine(object())
    scopes = RunScopes()
    scopes.add(["a"])
    assert scopes.scope(one) is not scopes.scope(other)
    scopes.close()
    assert all(s.closed for s in (*one.opened, *other.opened))


def test_an_engine_without_a_trie_is_its_own_key() -> None:
    server = _Engine(None)
    del server.trie
    scopes = RunScopes()
    scopes.add(["a"])
    first = scopes.scope(server)
    scopes.add(["b"])
    assert first is scopes.scope(server)
    assert server.opened[0].documents == ["a", "b"]
